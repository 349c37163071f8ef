"""A run killed while its checkpoint is written on the background thread (results/
checkpoint_writer.py) continues from the previous checkpoint exactly: the rows, evaluation,
sentences and events.log lines recorded after that one (the in-flight checkpoint's own
``checkpoint`` line and rows among them) are cut on resume, and the resumed run ends where an
uninterrupted run ends, bit for bit."""
import json
import os
import signal
import time

import pytest
import torch

from speechperf.results import ResultsDB
from speechperf.results.checkpoint import load as load_checkpoint
from speechperf.results.events import read_events
from tests.conftest import cli_start

ARGS = ["--preset", "tiny", "threads=1", "max_epochs=2", "checkpoint_every=3", "sentence_every=1"]


def _train(*args, child: tuple[str, object] | None = None):
    """``speechperf train --json ARGS`` started (Popen's interface); ``child``: (how, marker) of
    tests/train/write_fault_child.py's injected writes."""
    if child is None:
        return cli_start("train", "--json", *args)
    return cli_start(*child, "train", "--json", *args, module="tests.train.write_fault_child")


def _rows(run, sql):
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    with ResultsDB(run / "results.db") as db:
        return db.query(sql, [run_id])


def _sentence_iterations(run) -> list[int]:
    lines = (run / "sentences.jsonl").read_text().splitlines()
    return [json.loads(line)["iteration"] for line in lines if line.endswith("}")]


def _checkpoint_lines(run) -> list[tuple[str, int]]:
    return [(e["key"], e["metadata"]["iteration"]) for e in read_events(run / "events.log")
            if e["key"] in ("checkpoint", "checkpoint_written")]


def _kill_once_recorded_past(p, run, marker):
    """SIGKILL ``p`` once its epoch-end checkpoint's write stalled and the loop has logged a
    sentence after that checkpoint; returns the stalled checkpoint's iteration."""
    deadline = time.monotonic() + 240
    while not (marker.exists() and marker.read_text() and max(_sentence_iterations(run)) > int(marker.read_text())):
        assert p.poll() is None and time.monotonic() < deadline, p.stderr.read() if p.poll() is not None else "slow"
        time.sleep(0.02)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    return int(marker.read_text())


@pytest.mark.timeout(600)
def test_a_kill_during_a_background_checkpoint_write_resumes_exactly(tiny_features, tmp_path):
    ref, run, marker = tmp_path / "ref", tmp_path / "run", tmp_path / "stalled"
    p = _train("--data", tiny_features, "--out", ref, *ARGS)
    assert p.wait(timeout=300) == 0, p.stderr.read()

    stalled = _kill_once_recorded_past(_train("--data", tiny_features, "--out", run, *ARGS, child=("stall", marker)),
                                       run, marker)
    before = load_checkpoint(run)["progress"]
    assert before["epoch"] == 1 and before["iteration"] <= stalled  # the previous checkpoint (inside epoch 1), whole
    assert ("checkpoint", stalled) in _checkpoint_lines(run)  # recorded before the kill: cut on resume
    assert _rows(run, "SELECT MAX(iteration) AS i FROM iterations WHERE run_id = ?") == [{"i": stalled}]  # likewise
    assert _rows(run, "SELECT epoch FROM evals WHERE run_id = ? AND final = 0") == [{"epoch": 1}]

    p = _train("--resume", run)
    assert p.wait(timeout=300) == 0, p.stderr.read()
    sql = "SELECT iteration, loss, batch_size FROM iterations WHERE run_id = ? ORDER BY iteration"
    assert _rows(run, sql) == _rows(ref, sql)  # every loss, bit for bit
    sql = "SELECT epoch, split, final, loss, wer, cer FROM evals WHERE run_id = ? ORDER BY final, split, epoch"
    assert _rows(run, sql) == _rows(ref, sql)
    a, b = load_checkpoint(ref), load_checkpoint(run)
    assert all(torch.equal(v, b["model"][k]) for k, v in a["model"].items())
    assert _sentence_iterations(run) == _sentence_iterations(ref)  # none doubled, none lost
    lines = _checkpoint_lines(ref)
    assert [i for k, i in lines if k == "checkpoint"] == [i for k, i in lines if k == "checkpoint_written"]
    assert _checkpoint_lines(run) == lines  # each checkpoint and its completed write once, in the same order
    (again,) = [e["metadata"] for e in read_events(run / "events.log")
                if e["key"] == "checkpoint_written" and e["metadata"]["iteration"] == before["iteration"]]
    assert again["write_s"] is None  # logged anew by the resumed run: the killed process measured it


@pytest.mark.timeout(600)
@pytest.mark.parametrize("how", ["fail-6", "fail-final"])
def test_a_failed_background_write_fails_the_run_naming_the_file_and_the_same_command_continues(
        tiny_features, tmp_path, how):
    """Iteration 6's write fails: raised at the next checkpoint's wait; the final checkpoint's
    write fails: raised at the run's end, after the final evaluation. Either way the run is
    recorded failed (not finished), naming the file, and the same command continues it from
    the last checkpoint that was written."""
    run = tmp_path / "run"
    p = _train("--data", tiny_features, "--out", run, *ARGS, child=(how, tmp_path / "unused"))
    rc, err = p.wait(timeout=300), p.stderr.read()  # a forked child's stderr is a file: read it once it ended
    assert rc == 1, err
    assert f"writing the checkpoint {run / 'checkpoint.pt'} failed (OSError: [Errno 5] Input/output error)" in err
    assert "Traceback" not in err
    summary = json.loads((run / "summary.json").read_text())
    status = summary["status"]
    assert status.startswith("failed: ") and f"writing the checkpoint {run / 'checkpoint.pt'}" in status
    kept = load_checkpoint(run)["progress"]
    if how == "fail-6":
        assert kept["iteration"] == 3 and 6 < summary["iterations"] <= 9  # stopped at the next checkpoint's wait
    else:
        assert kept["status"] is None and kept["epoch"] == 3  # the last epoch's end: before the failed final one
    p = _train("--data", tiny_features, "--out", run, *ARGS)
    assert p.wait(timeout=300) == 0, p.stderr.read()
    assert json.loads((run / "summary.json").read_text())["status"] == "success"
    stops = [e["metadata"]["status"] for e in read_events(run / "events.log") if e["key"] == "run_stop"]
    assert stops == ["success"]  # the failed end's run_stop was cut back with the rest
