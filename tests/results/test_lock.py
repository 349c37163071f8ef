"""The run folder's lock (results/lock.py): one holder, named to the second; released with
its process however it ends, forked children (DataLoader readers) included."""
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from speechperf.results.lock import RunFolderBusy, RunLock

HOLDER = textwrap.dedent("""
    import os, sys, time
    from speechperf.results.lock import RunLock
    RunLock(sys.argv[1]).acquire()
    if os.fork() == 0:  # a reader process forked while the lock is held, outliving its parent
        time.sleep(10)
        os._exit(0)
    print("held", flush=True)
    time.sleep(60)
""")


def _holder(folder):
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    p = _holder(tmp_path)
    try:
        with pytest.raises(RunFolderBusy, match=rf"in use by another speechperf process \(pid {p.pid} on host "
                                                rf"{socket.gethostname()}\)"):
            RunLock(tmp_path).acquire()
    finally:
        p.kill()
        p.wait()


def test_a_killed_holder_s_lock_is_free_at_once_though_its_forked_child_lives(tmp_path):
    p = _holder(tmp_path)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    with RunLock(tmp_path) as lock:  # the child still runs: an flock would still be held by it
        assert lock.path.read_text().split() == [str(os.getpid()), socket.gethostname()]
    with RunLock(tmp_path):  # released on exit, taken again
        pass
