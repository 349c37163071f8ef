"""Defects a fault probe found in how ``train`` starts, stops and records a run (issue 30,
part 7): a refusal under torchrun and a taken parameter-server port leave no folder and name
the cause; a killed ``--seeds --parallel`` command takes its seeds with it and a busy folder
is said on the terminal (exit 2); a final evaluation stopped and run again logs each split once."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from speechperf.drive.sweep import free_port
from tests.conftest import cli_argv, torchrun, torchrun_args

ARGS = ["--preset", "tiny", "max_epochs=1", "threads=1", "device=cpu", "final_splits=none", "checkpoint_every=1000"]


def _torchrun(procs: int, *args, port: int | None = None, timeout=300) -> subprocess.CompletedProcess:
    return torchrun(*torchrun_args(*args, procs=procs, port=port), timeout=timeout)


def _said(p: subprocess.CompletedProcess) -> str:
    """What speechperf said (its one-line errors), without torchrun's own report."""
    return "\n".join(line for line in (p.stdout + p.stderr).splitlines() if "speechperf: error:" in line)


def _raw_rank_traceback(p: subprocess.CompletedProcess) -> bool:
    """A rank's uncaught exception, as torch prints it ("[rank0]: Traceback ..."); torchrun's
    own report of a rank that exited non-zero (ChildFailedError) is torchrun's, not a rank's."""
    return any(line.startswith("[rank") for line in p.stderr.splitlines())


# ---- 5. a launch refused under torchrun ---------------------------------------------------
def test_a_launch_refused_under_torchrun_creates_nothing(tiny_features, tmp_path):
    out = tmp_path / "run"
    p = _torchrun(2, "train", "--data", tiny_features, "--out", out, *ARGS, "algo.name=single")
    assert p.returncode != 0
    assert "algo.name=single trains in one process, not 2" in _said(p), p.stderr[-3000:]
    assert not _raw_rank_traceback(p), p.stderr[-3000:]
    assert not out.exists()  # no folder holding only its lock


# ---- 4. the parameter server's port (MASTER_PORT + 1) taken ---------------------------------
@pytest.mark.parametrize("algo", ["asgd"])  # easgd is an asgd (AsyncSGD): the same rpc start, the same check
def test_a_taken_parameter_server_port_is_named_and_creates_nothing(algo, tiny_features, tmp_path):
    out, port = tmp_path / "run", free_port()
    with socket.socket() as taken:  # another program on MASTER_PORT + 1
        taken.bind(("127.0.0.1", port + 1))
        taken.listen()
        p = _torchrun(2, "train", "--data", tiny_features, "--out", out, *ARGS, f"algo.name={algo}", port=port)
    said = _said(p)
    assert p.returncode != 0 and f"port {port + 1}" in said and "MASTER_PORT" in said, p.stderr[-3000:]
    assert "EADDRINUSE" not in p.stderr and not _raw_rank_traceback(p), p.stderr[-3000:]
    assert not out.exists()


# ---- 6. train --seeds N --parallel K: a killed command, a busy folder -----------------------
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (not reaped yet) has ended
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.timeout(300)
def test_the_seeds_of_a_killed_command_stop_with_it_saved(tiny_features, tmp_path):
    from speechperf.results.layout import has_checkpoint
    from speechperf.results.view import RunView

    out = tmp_path / "out"
    parent = subprocess.Popen(cli_argv("train", "--data", tiny_features, "--out", out, "--seeds", "2", "--parallel", "2",
                                   "--preset", "tiny", "threads=1", "max_epochs=100"),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    pids = {}
    try:
        deadline = time.time() + 180
        while len(pids) < 2 and time.time() < deadline:  # both seeds training: their run folders exist
            for s in (1, 2):
                if (out / f"seed-{s}" / "run.json").exists():
                    pids[s] = int((out / f"seed-{s}" / ".speechperf.lock").read_text().split()[0])
            time.sleep(0.2)
        assert len(pids) == 2, "the seeds did not start"
        parent.kill()  # SIGKILL: no handler runs in the parent
        parent.wait()
        deadline = time.time() + 120
        while any(_alive(p) for p in pids.values()) and time.time() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in pids.values()), "the seeds kept training without their command"
        for s in (1, 2):  # each was asked to save and stop (SIGTERM): the same command continues it
            with RunView.open(out / f"seed-{s}") as r:
                assert r.rows.row()["status"] == "failed: interrupted (SIGTERM)" and has_checkpoint(r.folder)
    finally:
        for p in pids.values():  # the processes this test started, by their id
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()


@pytest.mark.timeout(300)
def test_a_busy_seed_folder_is_said_on_the_terminal_with_exit_2(tiny_features, tmp_path):
    from speechperf.results.lock import RunLock

    out = tmp_path / "out"
    (out / "seed-1").mkdir(parents=True)
    with RunLock(out / "seed-1"):  # another speechperf process trains seed 1 (the test holds its lock)
        p = subprocess.run(cli_argv("train", "--data", tiny_features, "--out", out, "--seeds", "2", "--parallel", "2",
                                "--preset", "tiny", "threads=1", "max_epochs=100"),
                           capture_output=True, text=True, timeout=240)
    assert p.returncode == 2, p.stderr
    said = _said(p)
    assert f"seed 1 ({out / 'seed-1'}" in said and f"in use by another speechperf process (pid {os.getpid()}" in said, said
    assert "its run's status" not in said and "seeds 2 not finished" in said, said


# ---- 7. a final evaluation stopped by a signal, then the same command --------------------------
def test_a_final_evaluation_stopped_and_run_again_logs_each_split_once(tiny_features, tmp_path, monkeypatch):
    from speechperf.train import loop
    from speechperf.train.request import TrainRequest
    from speechperf.results.events import read_events
    from speechperf.train.stop import Interrupted

    run, real, calls = tmp_path / "run", loop._evaluate, []
    args = ["threads=1", "max_epochs=1", "train.eval.final_splits=dev-clean,test-clean"]

    def signalled(model, t, split, beam, **kw):
        result = real(model, t, split, beam, **kw)
        if beam == t.cfg.train.eval.final_beam and not calls:
            calls.append(split)
            os.kill(os.getpid(), signal.SIGTERM)  # after the first final split was evaluated
        return result

    monkeypatch.setattr(loop, "_evaluate", signalled)
    with pytest.raises(Interrupted):
        loop.train(TrainRequest("tiny", tiny_features, run, args, quiet=True))
    monkeypatch.setattr(loop, "_evaluate", real)
    assert loop.train(TrainRequest("tiny", tiny_features, run, args, quiet=True))["status"] == "success"
    finals = [e["metadata"]["split"] for e in read_events(run / "events.log") if e["key"] == "final_eval"]
    assert sorted(finals) == ["dev-clean", "test-clean"], finals
    stops = [e["metadata"]["status"] for e in read_events(run / "events.log") if e["key"] == "run_stop"]
    assert stops == ["success"], stops  # the interrupted attempt's run_stop went with its lines
