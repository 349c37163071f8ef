"""Issue 48: SIGTERM sent to a run's whole process group (Slurm's scancel, Kubernetes) at each phase
of a run with reader processes on (tests/train/stop_child.py picks the moment), and SIGINT (Ctrl-C)
inside an evaluation: the process is gone within 10 s with exit 143 (130), recorded as interrupted, no reader left at its exit nor after it,
and the same command then ends where an uninterrupted run ends, bit for bit."""
import json
import os
import time

import pytest
import torch

from speechperf.results import ResultsDB
from speechperf.results.checkpoint import load as load_checkpoint
from tests.conftest import cli, cli_start

ARGS = ["--preset", "tiny", "threads=1", "max_epochs=3", "checkpoint_every=4", "sentence_every=50", "readers=1"]


@pytest.fixture(scope="module")
def reference(tiny_features, tmp_path_factory):
    ref = tmp_path_factory.mktemp("stop-ref") / "run"
    cli("train", "--json", "--data", tiny_features, "--out", ref, *ARGS, timeout=600, check=True)
    return ref


def _rows(run, sql):
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    with ResultsDB(run / "results.db") as db:
        return db.query(sql, [run_id])


@pytest.mark.timeout(900)
@pytest.mark.parametrize("phase", ["step", "eval", "checkpoint", "eval:SIGINT"])
def test_a_stop_signal_to_the_group_in_each_phase_ends_the_run_at_once_saved(tiny_features, reference, tmp_path, phase):
    run, marker, left = tmp_path / "run", tmp_path / "signalled", tmp_path / "left"
    name, code = ("SIGINT", 130) if phase.endswith("SIGINT") else ("SIGTERM", 143)
    p = cli_start(phase, marker, left, "train", "--json", "--data", tiny_features, "--out", run, *ARGS, session=True,
                  module="tests.train.stop_child")
    rc = p.wait(timeout=600)
    ended, err = time.time(), p.stderr.read()
    assert rc == code, err
    assert ended - float(marker.read_text()) < 10, "the stopped process took too long to end"
    assert f"interrupted ({name})" in err and "Traceback" not in err
    assert json.loads(left.read_text()) == []  # every reader stopped by the loop itself, none left for the exit
    with pytest.raises(ProcessLookupError):
        os.killpg(p.pid, 0)  # nothing of its process group outlives it
    assert _rows(run, "SELECT status FROM runs WHERE run_id = ?") == [{"status": f"failed: interrupted ({name})"}]

    cli("train", "--json", "--data", tiny_features, "--out", run, *ARGS, timeout=600, check=True)
    sql = "SELECT iteration, loss FROM iterations WHERE run_id = ? ORDER BY iteration"
    assert _rows(run, sql) == _rows(reference, sql)
    sql = "SELECT epoch, loss, cer FROM evals WHERE run_id = ? AND final = 0 ORDER BY epoch"
    assert _rows(run, sql) == _rows(reference, sql)
    a, b = load_checkpoint(reference), load_checkpoint(run)
    assert all(torch.equal(v, b["model"][k]) for k, v in a["model"].items())
