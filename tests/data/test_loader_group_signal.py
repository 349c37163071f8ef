"""Issue 61: a stop signal sent to the whole process group (Slurm's scancel, Kubernetes) while a
loader's readers are starting never kills a reader. torch's worker sets its own SIGTERM handler
(which dies of a signal its parent did not send) before the loader's ``worker_init_fn`` ignores
it; the readers are therefore forked with both stop signals blocked and ignore them before they
unblock them, so every moment of a reader's start is covered."""
import json
import os
import signal

import psutil
import pytest

from tests.conftest import cli_start

TRIES = 12  # before the fix 14 of 24 such signals killed the reader: all 12 survive it by chance 1 in 30,000


@pytest.mark.timeout(300)
def test_a_group_sigterm_as_readers_appear_never_kills_one(tiny_features, tmp_path):
    out = tmp_path / "tries.json"
    p = cli_start(tiny_features, TRIES, out, session=True, module="tests.data.group_signal_child")
    proc, seen, sent = psutil.Process(p.pid), set(), 0
    while p.poll() is None:
        try:
            readers = {c.pid for c in proc.children()}
        except psutil.Error:
            break
        if readers - seen:  # a try's reader has just been forked: signal the whole group now
            os.killpg(p.pid, signal.SIGTERM)
            sent += 1
        seen |= readers
    assert p.wait(timeout=60) == 0, p.stderr.read()
    assert json.loads(out.read_text()) == [signal.SIGTERM] * TRIES
    assert sent == TRIES
