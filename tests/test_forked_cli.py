"""conftest's cli() forks ``speechperf`` from a preloaded server (tests/forked_cli.py): what a
command prints and returns is what a fresh ``python -m speechperf`` prints and returns, in the
caller's folder and environment; a call whose environment (its own, or one a test changed)
differs in a variable read when a library loads runs a fresh interpreter; a command past its
timeout is killed. torchrun's launcher forks, and its workers fork where theirs allows."""
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests import forked_cli
from tests.conftest import cli, torchrun, torchrun_start


def test_a_forked_command_prints_and_returns_what_a_fresh_one_does(tmp_path, monkeypatch):
    for args in (["tta", "--help"], ["tta", "no-such-run"], ["train", "--no-such-option"]):
        forked, fresh = cli(*args), cli(*args, fresh=True)
        assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert cli("tta", "no-such-run").returncode == 2
    monkeypatch.chdir(tmp_path)  # the caller's folder: a relative path is read from it
    (tmp_path / "run").mkdir()
    assert "run is not a run folder" in cli("tta", "run").stderr


def test_a_variable_read_at_load_time_starts_a_fresh_interpreter(monkeypatch):
    cli("tta", "--help", check=True)  # the server runs, with this environment
    assert forked_cli.usable({}) and forked_cli.usable({"cwd": "."})
    threads = str(int(os.environ.get("OMP_NUM_THREADS", "1")) + 1)
    assert not forked_cli.usable({"env": {**os.environ, "OMP_NUM_THREADS": threads}})  # OpenMP read it on load
    assert forked_cli.usable({"env": {**os.environ, "MLFLOW_TRACKING_URI": "x"}})  # read when used, in the child
    added = {**os.environ, "PYTHONPATH": os.pathsep.join(["/elsewhere", os.environ.get("PYTHONPATH", "")])}
    assert forked_cli.usable({"env": added})  # the child puts the folder on its path
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "SSE41-forked-cli-test")  # a test's own change counts as well
    assert not forked_cli.usable({})


def test_a_command_past_its_timeout_is_killed(tiny_features, tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        forked_cli.run(["train", "--data", str(tiny_features), "--out", str(tmp_path / "run"), "--preset", "tiny"],
                       timeout=0.2)


def test_a_forked_torchrun_prints_and_returns_what_a_fresh_one_does():
    """torchrun's launcher forked from the server (conftest's torchrun()) answers as ``python -m
    torch.distributed.run`` does: its help, and a refused option with its exit status."""
    for args in (["--help"], ["--no-such-option", "-m", "speechperf"]):
        forked = torchrun(*args, timeout=60)
        fresh = subprocess.run([sys.executable, "-m", "torch.distributed.run", *args], capture_output=True,
                               text=True, timeout=60)
        assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.returncode == 2 and "--no-such-option" in forked.stderr


@pytest.mark.parametrize("changed", [False, True], ids=["forked", "fresh"])
def test_torchruns_workers_fork_where_their_environment_allows_and_end_with_the_launcher(changed):
    """The forked launcher's agent starts each worker (``python -u -m MODULE``) forked from the
    server, in a session of its own, noted by rank; a worker environment that differs in a
    variable read at load time runs torchrun's own Popen (the launcher's child). SIGTERM to the
    launcher ends every worker (the agent's os.killpg), and the launcher's status says so."""
    if not changed and not forked_cli.usable({"env": {**os.environ, "OMP_NUM_THREADS": "1"}}):
        pytest.skip("this process has other OpenMP threads than torchrun's workers (1): they run fresh")
    env = {"PYTHON_FORKED_CLI_TEST": "1"} if changed else None  # PYTHON*: read by the interpreter at start
    p = torchrun_start("--nproc-per-node", "2", "-m", "timeit", "-n", "1", "-r", "1", "import time; time.sleep(120)",
                       env=env)
    deadline = time.time() + 60
    while len(p.workers()) < 2 and time.time() < deadline:
        time.sleep(0.05)
    workers = {rank: psutil.Process(pid) for rank, pid in p.workers().items()}
    assert sorted(workers) == [0, 1]
    server = psutil.Process(p.pid).ppid()
    for w in workers.values():
        assert w.ppid() == (p.pid if changed else server)
        assert os.getsid(w.pid) == w.pid  # torchrun's start_new_session: os.killpg reaches it
        assert ("timeit" in w.cmdline()) == changed  # a forked one shows the server's command line
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) != 0
    gone, alive = psutil.wait_procs(workers.values(), timeout=30)
    assert not alive


def hangs(rank: int, seconds: float) -> None:
    """Rank 1 never ends in time (as a hung process group's rank would); rank 0 returns."""
    if rank == 1:
        time.sleep(seconds)


def test_processes_past_their_deadline_are_killed_and_their_stacks_shown():
    """start_processes (the gloo tests' spawn) fails a hang in its own words, with where each rank
    waited, instead of waiting out pytest's timeout (which kills the xdist worker silently)."""
    start = time.monotonic()
    with pytest.raises(TimeoutError) as e:
        forked_cli.start_processes(hangs, (600.0,), 2, deadline=3)
    assert time.monotonic() - start < 30
    said = str(e.value)
    assert "tests.test_forked_cli.hangs: 2 processes not done after 3 s" in said
    assert "rank 0:\n(ended)" in said and "in hangs" in said.split("rank 1:")[1]  # the sleeping frame, rank 1's
