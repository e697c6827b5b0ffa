"""The one way settings enter every nanoswap script (train.py, sample.py, ...).

Scripts keep settings as plain module globals and let the command line replace them:

    batch_size = 12
    from configurator import configure, settings_of
    globals().update(configure(settings_of(globals()), sys.argv[1:], prog='train.py', doc=__doc__))

argv is processed left to right, later elements win:
  config/foo.py   Python assignments (`n_layer = 6`) that may read the current settings
  --key=value     value read with ast.literal_eval, falling back to the raw text
  --help / -h     list every setting with its default, exit 0
Values must fit the type of their default; any user mistake prints one `error: ...`
line to stderr and exits with code 2.
"""
import ast
import difflib
import sys
import traceback
import types

SETTING_TYPES = (bool, int, float, str, type(None))


class ConfigError(ValueError):
    """A user mistake in argv or a config file; configure() reports it as one line."""


def settings_of(namespace: dict) -> dict:
    """The settings in a script's globals(): public names holding bool/int/float/str/None."""
    return {k: v for k, v in namespace.items()
            if not k.startswith('_') and isinstance(v, SETTING_TYPES)}


def _type_name(default):
    # a None default marks an optional int (e.g. n_kv_head: None means "same as n_head")
    return 'int, bool or None' if default is None else type(default).__name__


def _check(defaults, key, value, raw=None):
    """Return `value` as the type of defaults[key], or raise ConfigError."""
    if key not in defaults:
        close = difflib.get_close_matches(key, list(defaults), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ''
        raise ConfigError(f"unknown setting '{key}'{hint}")
    default = defaults[key]
    # bool is a subclass of int, so it must be tested first and excluded from int/float
    if isinstance(default, bool):
        if isinstance(value, (bool, str)) and str(value).lower() in ('true', 'false'):
            return str(value).lower() == 'true'
    elif isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(default, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif isinstance(default, str):
        if isinstance(value, str):  # includes a quoted literal like "'hello'"
            return value
        if raw is not None:  # CLI text stays text: --start=123 gives '123', not 123
            return raw
    elif value is None or isinstance(value, int):
        return value
    elif isinstance(value, str) and value.lower() in ('true', 'false'):  # --compile=false: None means auto
        return value.lower() == 'true'
    raise ConfigError(f"setting '{key}' expects {_type_name(default)}, "
                      f"got {value!r} ({type(value).__name__})")


def _apply_override(arg, defaults, settings):
    key, sep, raw = arg[2:].partition('=')  # first '=' only: --start=a=b gives 'a=b'
    if not arg.startswith('--') or not sep or not key:
        raise ConfigError(f"malformed argument '{arg}': expected --key=value")
    try:
        value = ast.literal_eval(raw)
    except Exception:  # anything that is not a Python literal is just text
        value = raw
    settings[key] = _check(defaults, key, value, raw)


def _apply_file(path, defaults, settings):
    try:
        with open(path) as f:
            source = f.read()
    except OSError as e:  # missing, a directory, unreadable, ...
        problem = ' not found' if isinstance(e, FileNotFoundError) else f': {e.strerror}'
        raise ConfigError(f"config file '{path}'{problem}") from None
    namespace = dict(settings)  # a copy, so the file can read earlier values safely
    try:
        exec(compile(source, path, 'exec'), namespace)
    except SyntaxError as e:
        raise ConfigError(f"config file '{path}' line {e.lineno}: {e.msg}") from None
    except Exception as e:
        # report the deepest line of the config file itself, not of whatever it called
        lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == path]
        where = f' line {lines[-1]}' if lines else ''
        raise ConfigError(f"config file '{path}'{where}: {type(e).__name__}: {e}") from None
    for key, value in namespace.items():
        # imports and helper functions/classes are tools of the file, not settings
        if key.startswith('_') or isinstance(value, types.ModuleType) or callable(value):
            continue
        try:
            settings[key] = _check(defaults, key, value)
        except ConfigError as e:
            raise ConfigError(f"config file '{path}': {e}") from None


def _shown(value):
    # strings appear as typed on the CLI, unless blank or invisible (e.g. a newline)
    plain = not isinstance(value, str) or (value.isprintable() and value.strip() == value != '')
    return value if plain else repr(value)


def _print_help(defaults, prog, doc):
    print(f"usage: python {prog or sys.argv[0]} [config_file.py ...] [--key=value ...]")
    if doc:
        print('\n' + doc.strip() + '\n')
    items = [(f'--{k}={_shown(v)}', _type_name(v)) for k, v in defaults.items()]
    width = max((len(a) for a, _ in items), default=0)
    for arg, type_name in items:
        print(f'  {arg:<{width}}  ({type_name})')


def configure(defaults: dict, argv: list, prog: str = None, doc: str = None) -> dict:
    """Return a new dict of `defaults` updated by the config files and overrides in argv."""
    if '--help' in argv or '-h' in argv:
        try:
            _print_help(defaults, prog, doc)
        except BrokenPipeError:  # `--help | head` closed the pipe: nothing left to tell
            sys.stderr.close()
        sys.exit(0)
    settings = dict(defaults)
    try:
        for arg in argv:
            if arg.startswith('-'):
                _apply_override(arg, defaults, settings)
            else:
                _apply_file(arg, defaults, settings)
    except ConfigError as e:
        # one line, no traceback: the user made a typo, not the program
        print('error: ' + ' '.join(str(e).splitlines()), file=sys.stderr)
        sys.exit(2)
    return settings
