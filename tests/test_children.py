"""speechperf/children.py's ``sigterm_stops``: SIGTERM raised as a stop where the code is, the
handler before put back after."""
import os
import signal

import pytest

from speechperf.children import sigterm_stops
from speechperf.errors import Stopped


def test_a_sigterm_inside_raises_a_stop_of_exit_143_and_the_handler_is_put_back():
    before = signal.getsignal(signal.SIGTERM)
    cleaned = []
    with pytest.raises(Stopped) as e:
        with sigterm_stops():
            try:
                os.kill(os.getpid(), signal.SIGTERM)  # the handler raises at the next bytecode
            finally:
                cleaned.append(True)  # a with block's cleanup runs
    assert e.value.exit_code == 143 and "stopped by SIGTERM" in str(e.value) and cleaned
    assert signal.getsignal(signal.SIGTERM) is before
