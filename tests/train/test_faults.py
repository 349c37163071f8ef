"""Fault injection: kills, missing data and values that cannot train.

Each case runs the CLI as a user would and checks the run is either exactly right or
refused with a message naming what is wrong (exit 2, no run folder made).
"""
import json
import os
import random
import shutil
import signal
import time

import pytest
import torch

from speechperf.results import ResultsDB
from speechperf.results.checkpoint import CheckpointError, load as load_checkpoint
from speechperf.results.events import read_events
from tests.conftest import cli, cli_start, shared_folder

TINY = ["--preset", "tiny", "threads=1"]


def _popen(*args, session: bool = False):
    """``speechperf train --json ARGS``; ``session``: in its own process group (as Slurm starts a job step)."""
    return cli_start("train", "--json", *args, session=session)


def _rows(run, sql):
    info = json.loads((run / "run.json").read_text())
    with ResultsDB(run / "results.db") as db:
        return db.query(sql, [info["run_id"]])


@pytest.fixture
def feats(tiny_features, tmp_path):
    out = tmp_path / "feats"
    shutil.copytree(tiny_features, out)
    return out


@pytest.mark.parametrize("split,role", [("train-clean", "train"), ("dev-clean", "validation"),
                                        ("test-other", "final-evaluation")])
def test_a_missing_split_is_refused_before_training(feats, tmp_path, split, role):
    (feats / split / "index.json").unlink()
    run = tmp_path / "run"
    p = cli("train", "--data", feats, "--out", run, *TINY)
    assert p.returncode == 2, p.stderr
    assert f"{role} split {split!r}" in p.stderr and str(feats / split / "index.json") in p.stderr
    assert not run.exists()  # refused before the run folder (and the model, and the clock)


def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage,named", [
    (lambda f: (f / "stats.json").unlink(), "stats.json is missing"),
    (lambda f: (f / "stats.json").write_text('{"mean": [0.0], "std": [0.0]}'), "std > 0"),
    (lambda f: _flip_a_byte(f / "train-clean" / "shard-00000.npz"), "shard-00000.npz does not match its checksum"),
    (lambda f: _flip_a_byte(f / "dev-clean" / "shard-00000.npz"), "shard-00000.npz does not match its checksum"),
])
def test_damaged_statistics_or_shards_are_refused_before_the_run_folder_exists(feats, tmp_path, damage, named):
    damage(feats)
    run = tmp_path / "run"
    p = cli("train", "--data", feats, "--out", run, *TINY, "max_epochs=1")
    assert p.returncode == 2 and named in p.stderr, p.stderr
    assert not run.exists()  # no folder, no run_start, no clock


def test_named_splits_train_without_the_missing_one(feats, tmp_path):
    (feats / "test-other" / "index.json").unlink()
    run = tmp_path / "run"
    p = cli("train", "--data", feats, "--out", run, *TINY, "max_epochs=1",
             "final_splits=dev-clean,test-clean", "--json")
    assert p.returncode == 0, p.stderr
    finals = _rows(run, "SELECT split FROM evals WHERE run_id = ? AND final = 1 ORDER BY split")
    assert [r["split"] for r in finals] == ["dev-clean", "test-clean"]
    (used,) = [e["value"] for e in read_events(run / "events.log") if e["key"] == "data_splits"]
    assert used["final"] == ["dev-clean", "test-clean"] and used["valid"] == "dev-clean"


@pytest.mark.parametrize("override,message", [
    ("lr=inf", "train.optim.lr=inf must be a finite number"),
    ("batch_size=100000", "loader.batch_size=100000 is larger than the {n} utterances"),
])
def test_values_that_cannot_train_are_refused(tiny_features, tmp_path, override, message):
    from speechperf.features.shards import load_index

    n = sum(len(load_index(p)["utterances"]) for p in sorted(tiny_features.glob("train*")))
    run = tmp_path / "run"
    p = cli("train", "--data", tiny_features, "--out", run, *TINY, override)
    assert p.returncode == 2 and message.format(n=n) in p.stderr, p.stderr
    assert not run.exists()


def _wait_checkpoint(run, p, at_least):
    """Until the run's checkpoint is at iteration >= at_least (False: it finished first)."""
    while p.poll() is None:
        try:
            if load_checkpoint(run)["progress"]["iteration"] >= at_least:
                return True
        except CheckpointError:
            pass
        time.sleep(0.01)
    return False


@pytest.mark.timeout(600)
def test_a_chain_of_sigkills_and_resumes_equals_the_uninterrupted_run(tiny_features, tmp_path):
    args = [*TINY, "max_epochs=4", "checkpoint_every=3", "sentence_every=5"]
    ref, run = tmp_path / "ref", tmp_path / "run"
    p = _popen("--data", tiny_features, "--out", ref, *args)
    assert p.wait(timeout=300) == 0, p.stderr.read()
    total = load_checkpoint(ref)["progress"]["iteration"]

    rng = random.Random(13)
    targets = sorted(rng.sample(range(2, total - 2), 4))
    p, resumed = _popen("--data", tiny_features, "--out", run, *args), []
    for target in targets:
        if not _wait_checkpoint(run, p, target):
            break
        time.sleep(rng.random() * 0.2)  # anywhere between two checkpoints
        if p.poll() is not None:
            break
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        resumed.append(load_checkpoint(run)["progress"]["iteration"])
        p = _popen("--resume", run)
    assert p.wait(timeout=300) == 0, p.stderr.read()
    assert len(resumed) >= 2, f"the run finished before it was killed often enough ({resumed})"

    sql = "SELECT iteration, loss, batch_size FROM iterations WHERE run_id = ? ORDER BY iteration"
    assert _rows(run, sql) == _rows(ref, sql)  # every loss, bit for bit
    a, b = load_checkpoint(ref), load_checkpoint(run)
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    sql = "SELECT epoch, split, final, loss, wer, cer FROM evals WHERE run_id = ? ORDER BY final, split, epoch"
    assert _rows(run, sql) == _rows(ref, sql)


@pytest.mark.timeout(600)
def test_a_resume_given_another_thread_count_computes_with_the_run_s(tiny_features, tmp_path):
    """The one inexact resume fault injection found: with train.system.threads=0 the intra-op thread count is the
    process's (OMP_NUM_THREADS, the CPUs it may use); sums split by thread round differently,
    so a resume given another count drifted from the second resumed step on. The count is
    kept in the checkpoint and restored."""
    args = ["--preset", "tiny", "max_epochs=2", "checkpoint_every=3", "sentence_every=50"]
    # both variables: torch's default count reads MKL_NUM_THREADS after OMP_NUM_THREADS (tests/conftest.py sets both)
    two = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    one = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    ref, run = tmp_path / "ref", tmp_path / "run"

    def popen(*a, env):  # forked where env is the suite server's, a fresh interpreter for another OMP_NUM_THREADS
        return cli_start("train", "--json", *a, env=env)

    # the run at one thread (forked from the suite's server where it runs at one), its resume at two
    p = popen("--data", tiny_features, "--out", ref, *args, env=one)
    assert p.wait(timeout=300) == 0, p.stderr.read()
    p = popen("--data", tiny_features, "--out", run, *args, env=one)
    assert _wait_checkpoint(run, p, 6), "the run finished before it could be killed"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert load_checkpoint(run)["rng"]["threads"] == 1
    p = popen("--resume", run, env=two)
    assert p.wait(timeout=300) == 0, p.stderr.read()
    sql = "SELECT iteration, loss FROM iterations WHERE run_id = ? ORDER BY iteration"
    assert _rows(run, sql) == _rows(ref, sql)
    a, b = load_checkpoint(ref), load_checkpoint(run)
    assert all(torch.equal(v, b["model"][k]) for k, v in a["model"].items())


SIGTERM_ARGS = [*TINY, "max_epochs=3", "checkpoint_every=4", "sentence_every=50"]


@pytest.fixture(scope="module")
def sigterm_ref(tiny_features, tmp_path_factory):
    """The uninterrupted run both SIGTERM cases end equal to, trained once (readers=0: a reader
    process changes no batch, data/plan.py)."""
    def build(folder):
        p = _popen("--data", tiny_features, "--out", folder / "ref", *SIGTERM_ARGS, "readers=0")
        assert p.wait(timeout=300) == 0, p.stderr.read()

    return shared_folder(tmp_path_factory, "sigterm-ref", build) / "ref"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("group", [False, True], ids=["process", "process-group"])
def test_sigterm_stops_saved_and_recorded_and_the_same_command_continues(tiny_features, sigterm_ref, tmp_path, group):
    """SIGTERM (Slurm, Kubernetes, docker stop, torchrun) is handled as SIGINT: the run stops
    after the current step with a checkpoint, is recorded as interrupted (not finished), says
    that the same command continues it, exits 143; the same command then ends where an
    uninterrupted run ends, weights bit for bit. Sent to the whole process group (scancel,
    Ctrl-C), its data readers ignore it: the run still stops as above instead of failing on
    a dead reader."""
    args = [*SIGTERM_ARGS, f"readers={int(group)}"]
    ref, run = sigterm_ref, tmp_path / "run"
    p = _popen("--data", tiny_features, "--out", run, *args, session=group)
    assert _wait_checkpoint(run, p, 4), "the run finished before it could be stopped"
    if group:
        os.killpg(p.pid, signal.SIGTERM)
    else:
        p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=120) == 143
    err = p.stderr.read()
    assert "interrupted (SIGTERM)" in err and "run the same command again to continue" in err and str(run) in err
    assert "Traceback" not in err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed: interrupted (SIGTERM)"
    assert summary["model_flops_steps"] == summary["iterations"] and summary["tflops"] > 0  # its MFU over the steps it trained
    assert _rows(run, "SELECT status FROM runs WHERE run_id = ?") == [{"status": summary["status"]}]
    stopped_at = load_checkpoint(run)["progress"]["iteration"]
    assert stopped_at == summary["iterations"]  # saved where it stopped, not at the last periodic checkpoint
    stop = [e for e in read_events(run / "events.log") if e["key"] == "run_stop"]
    assert [e["metadata"]["status"] for e in stop] == ["aborted"] and "SIGTERM" in stop[0]["metadata"]["reason"]

    again = _popen("--data", tiny_features, "--out", run, *args)
    assert again.wait(timeout=300) == 0, again.stderr.read()
    assert json.loads((run / "summary.json").read_text())["status"] == "success"
    sql = "SELECT iteration, loss FROM iterations WHERE run_id = ? ORDER BY iteration"
    assert _rows(run, sql) == _rows(ref, sql)
    a, b = load_checkpoint(ref), load_checkpoint(run)
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    keys = [e["key"] for e in read_events(run / "events.log")]
    assert keys.count("run_stop") == 1 and keys.count("resume") == 1


@pytest.mark.timeout(300)
def test_samples_survive_a_sigkill_up_to_the_last_checkpoint(tiny_features, tmp_path):
    run = tmp_path / "run"
    # max_epochs far past what 4 s of clock can train on any machine: the run must still be
    # going when it is killed (with 20 epochs a fast CI machine finished first)
    p = _popen("--data", tiny_features, "--out", run, *TINY, "max_epochs=100000", "checkpoint_every=3")
    clock_s = _kill_at(p, run, 4.0)  # a checkpoint 4 s of training in
    samples = _rows(run, "SELECT t, metric FROM samples WHERE run_id = ? AND source = 'cpu'")
    assert samples, "no utilization sample of the killed run was stored"
    # stored with the checkpoint, every one up to its moment: the sampler scans for child processes
    # then (Sampler.flush) instead of leaving the last 1-2 s open to a later scan (issue 48)
    assert clock_s - 0.1 <= max(s["t"] for s in samples) <= clock_s + 0.5


def _kill_at(p, run, clock_s: float, sig=signal.SIGKILL) -> float:
    """Send ``sig`` to the training process ``p`` once a checkpoint ``clock_s`` seconds of
    training in exists; returns that checkpoint's clock."""
    at = -1.0
    while p.poll() is None and at < clock_s:
        try:
            at = load_checkpoint(run)["progress"]["clock_s"]
        except CheckpointError:
            pass
        time.sleep(0.1)  # reading the checkpoint costs CPU the run needs: not too often
    assert p.poll() is None, f"the run ended before it could be stopped: {p.stderr.read()}"
    os.kill(p.pid, sig)
    p.wait(timeout=120)
    return load_checkpoint(run)["progress"]["clock_s"]


@pytest.mark.timeout(300)
def test_a_resumed_run_s_samples_continue_its_clock(tiny_features, tmp_path):
    """Samples are stamped on the run's TTA clock: a resumed process's start after the
    checkpoint's clock, they do not pile up again from t = 0."""
    run = tmp_path / "run"
    args = ["--data", tiny_features, "--out", run, *TINY, "max_epochs=100000", "checkpoint_every=3"]
    killed = _kill_at(_popen(*args), run, 3.0)
    sql = "SELECT t FROM samples WHERE run_id = ? AND source = 'cpu'"
    before = sorted(s["t"] for s in _rows(run, sql))
    assert before and killed - 0.1 <= max(before) <= killed + 0.5
    stopped = _kill_at(_popen(*args), run, killed + 3.0, signal.SIGTERM)
    after = sorted(s["t"] for s in _rows(run, sql))
    assert [t for t in after if t <= killed] == [t for t in before if t <= killed]  # nothing new before the kill
    resumed = after[len([t for t in after if t <= killed]):]
    assert resumed and killed < min(resumed) <= killed + 2.5 and max(resumed) <= stopped + 0.5


@pytest.mark.timeout(300)
def test_two_trains_on_one_folder_leave_one_run_and_a_killed_holder_does_not_block(tiny_features, tmp_path):
    import socket

    run = tmp_path / "run"
    args = ["--data", tiny_features, "--out", run, *TINY, "max_epochs=100000", "checkpoint_every=3"]
    first = _popen(*args)
    while p_alive(first) and not (run / "run.json").exists():
        time.sleep(0.1)
    second = cli("train", *args)
    assert second.returncode == 2, second.stderr
    assert f"in use by another speechperf process (pid {first.pid} on host {socket.gethostname()})" in second.stderr
    killed = _kill_at(first, run, 1.0)  # the holder dies: its lock goes with it
    again = _popen(*args)
    _kill_at(again, run, killed + 1.0, signal.SIGTERM)
    info = json.loads((run / "run.json").read_text())
    with ResultsDB(run / "results.db") as db:
        assert [r["run_id"] for r in db.query("SELECT run_id FROM runs")] == [info["run_id"]]
        iters = [r["iteration"] for r in db.query("SELECT iteration FROM iterations ORDER BY iteration")]
    assert iters == list(range(1, len(iters) + 1))  # one run's rows, none doubled
    keys = [e["key"] for e in read_events(run / "events.log")]
    assert keys.count("run_start") == 1 and keys.count("resume") == 1


def p_alive(p) -> bool:
    assert p.poll() is None, f"the run ended early: {p.stderr.read()}"
    return True
