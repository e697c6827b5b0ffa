"""Imported for its effect: data/ on sys.path, as each data/*/prepare.py puts it, so tests import prepare_common."""
import sys
from pathlib import Path

DATA = str(Path(__file__).resolve().parents[1] / "data")
if DATA not in sys.path:
    sys.path.insert(0, DATA)
