"""A run either finishes right or says why: a diverging run, a full disk, a
read-only folder and a corrupt results database, each through the real CLI: the message
names the file or value, the exit status is the documented one (2 bad input, 1 a run that
failed), the status is recorded, the last checkpoint stays usable, the same command resumes."""
import json
import os
import shutil
import sqlite3
import subprocess
import sys

import pytest

from speechperf.results.checkpoint import load as load_checkpoint
from speechperf.results.events import read_events
from tests.conftest import TINY_RUN, cli

TINY = ["--preset", "tiny", "max_epochs=3", "threads=1", "checkpoint_every=2"]


def test_a_diverging_run_ends_diverged_and_stays_so(tiny_features, tmp_path):
    run = tmp_path / "run"
    p = cli("train", "--data", tiny_features, "--out", run, *TINY, "lr=1e30")
    assert p.returncode == 1, p.stderr
    assert "non-finite" in p.stderr and "lr=1e+30" in p.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"].startswith("diverged: ")
    with sqlite3.connect(run / "results.db") as db:
        assert db.execute("SELECT status FROM runs").fetchone()[0] == summary["status"]
    stop = [e for e in read_events(run / "events.log") if e["key"] == "run_stop"]
    assert len(stop) == 1 and stop[0]["metadata"]["status"] == "aborted" and "non-finite" in stop[0]["metadata"]["reason"]
    log = (run / "events.log").read_bytes()
    again = cli("train", "--data", tiny_features, "--out", run, *TINY, "lr=1e30")  # reported, not trained again
    assert again.returncode == 1 and "diverged" in again.stdout
    assert (run / "events.log").read_bytes() == log


def test_a_corrupt_results_database_is_named_with_exit_2(tiny_features, tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)  # a finished run (the session's is only read)
    (run / "results.db").write_bytes(b"this is not a database" * 100)
    (run / "summary.json").unlink()  # as if killed after its last checkpoint: the same command resumes it
    for args in (("tta", run), ("report", run, "--out", tmp_path / "rep"),
                 ("train", "--data", tiny_features, "--out", run, *TINY_RUN)):
        p = cli(*args)
        assert p.returncode == 2, (args, p.stderr)
        assert str(run / "results.db") in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)


def _can_mount() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True).returncode == 0


needs_mount = pytest.mark.skipif(not _can_mount(), reason="needs root and a private mount namespace (unshare -m)")


def _in_namespace(script: str, tmp_path) -> subprocess.CompletedProcess:
    """Run ``script`` (sh) in a private mount namespace: its tmpfs vanishes with it."""
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path, env={**os.environ, "PYTHONUNBUFFERED": "1"})


@needs_mount
def test_a_full_disk_is_named_keeps_the_checkpoint_and_the_same_command_resumes(tiny_features, tmp_path):
    mnt, keep = tmp_path / "small", tmp_path / "kept"
    mnt.mkdir()
    train = f"{sys.executable} -m speechperf train --data {tiny_features} --out {mnt}/run {' '.join(TINY)}"
    # 900 KiB: the folder and one 540 KB checkpoint fit, the second (written beside the first) does not
    script = f"""
mount -t tmpfs -o size=900k tmpfs {mnt} || exit 97
{train} > first.out 2> first.err; echo $? > first.rc
cp -r {mnt}/run {keep}
mount -o remount,size=64m {mnt}
{train} > second.out 2> second.err; echo $? > second.rc
cp -r {mnt}/run {keep}-after
"""
    p = _in_namespace(script, tmp_path)
    assert p.returncode == 0, p.stderr
    first_err = (tmp_path / "first.err").read_text()
    assert (tmp_path / "first.rc").read_text().strip() == "1", first_err
    assert "disk full" in first_err and str(mnt) in first_err and "Traceback" not in first_err
    ckpt = load_checkpoint(keep)  # the previous checkpoint, intact
    assert ckpt["progress"]["iteration"] >= 2
    second_err = (tmp_path / "second.err").read_text()
    assert (tmp_path / "second.rc").read_text().strip() == "0", second_err
    summary = json.loads((tmp_path / "kept-after" / "summary.json").read_text())
    assert summary["status"] == "success" and summary["epochs"] == 3
    keys = [e["key"] for e in read_events(tmp_path / "kept-after" / "events.log")]
    assert keys.count("run_start") == 1 and keys.count("run_stop") == 1 and "resume" in keys


@needs_mount
def test_a_read_only_folder_is_named(tiny_features, tmp_path):
    mnt = tmp_path / "ro"
    mnt.mkdir()
    script = f"""
mount -t tmpfs -o size=1m,ro tmpfs {mnt} || exit 97
{sys.executable} -m speechperf train --data {tiny_features} --out {mnt}/run {' '.join(TINY)} 2> err; echo $? > rc
"""
    p = _in_namespace(script, tmp_path)
    assert p.returncode == 0, p.stderr
    err = (tmp_path / "err").read_text()
    assert (tmp_path / "rc").read_text().strip() == "1", err
    assert str(mnt / "run") in err and "Read-only" in err and "Traceback" not in err


def test_a_run_that_fails_in_its_initialization_is_recorded_failed_and_resumes(tiny_features, tmp_path, monkeypatch):
    import errno

    from speechperf.errors import MachineFault
    from speechperf.train import loop, trainer
    from speechperf.train.request import TrainRequest

    real = trainer.initialize

    def vanished(*args, **kw):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(tiny_features / "lm.json"))

    monkeypatch.setattr(trainer, "initialize", vanished)
    run = tmp_path / "run"
    with pytest.raises(MachineFault, match="lm.json"):
        loop.train(TrainRequest("tiny", tiny_features, run, ["max_epochs=1", "threads=1"], quiet=True))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"].startswith("failed: ") and "lm.json" in summary["status"]
    with sqlite3.connect(run / "results.db") as db:
        assert db.execute("SELECT status FROM runs").fetchone()[0] == summary["status"]
    monkeypatch.setattr(trainer, "initialize", real)
    assert loop.train(TrainRequest("tiny", tiny_features, run, ["max_epochs=1", "threads=1"], quiet=True))["status"] == "success"
