"""common/errors.py: a failed collective told from other errors; only the first signal interrupts."""

import os

import pytest
import torch

from common.errors import Interrupted, catch_interrupts, collective_error


@pytest.mark.parametrize('error, collective', [
    (torch.distributed.DistBackendError('NCCL communicator was aborted on rank 0'), True),
    (RuntimeError('[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:3'),
     True),
    (RuntimeError('mat1 and mat2 shapes cannot be multiplied (4x8 and 16x16)'), False),
    (ValueError('gloo'), False),
])
def test_a_failed_collective_is_told_from_other_errors(error, collective):
    """train.py turns a collective's failure (another rank killed) into one line naming the last checkpoint."""
    assert collective_error(error) is collective


def test_only_the_first_signal_interrupts():
    """Ctrl-C reaches ablate.py's runs, then ablate stops them with kill: that second signal, raised again while the
    run is stopping, would land in a destructor or an atexit hook ('Exception ignored in tqdm.__del__')."""
    import signal
    import sys
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), sys.excepthook
    catch_interrupts()
    try:
        with pytest.raises(Interrupted) as e:
            os.kill(os.getpid(), signal.SIGINT)
        assert e.value.code == 130
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # stopping already: nothing raised
        except Interrupted:
            pytest.fail('a second signal interrupted the stopping run again')
        catch_interrupts()  # a new start arms it again
        with pytest.raises(Interrupted) as e:
            os.kill(os.getpid(), signal.SIGTERM)
        assert e.value.code == 143
    finally:
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])
        sys.excepthook = handlers[2]
