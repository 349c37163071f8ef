"""The transducer with TDT durations trains through the real ``speechperf train`` command and resumes
exactly, by tests/train/test_every_model.py's machinery: killed after a checkpoint, the same command
continues it to the weights, losses and evaluations of an uninterrupted run (CPU, one thread)."""
import json
import signal

import pytest
import torch

from speechperf.results.checkpoint import load as load_checkpoint
from tests.conftest import cli, cli_start
from tests.train.test_every_model import SIZES, _args, _kill_after_first_checkpoint, _rows

TDT = [*SIZES["transducer"], "model.durations=0,1,2,3,4"]


@pytest.mark.timeout(600)
def test_a_tdt_trains_and_resumes_exactly(tiny_features, tmp_path):
    ref, run = tmp_path / "ref", tmp_path / "run"
    p = cli(*_args("transducer", tiny_features, ref), *TDT)
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    summary = summary[0] if isinstance(summary, list) else summary
    assert summary["status"] in ("success", "max_epochs") and summary["iterations"] > 3

    p = cli_start(*_args("transducer", tiny_features, run), *TDT)
    assert _kill_after_first_checkpoint(p, run) == -signal.SIGKILL
    p = cli(*_args("transducer", tiny_features, run), *TDT)
    assert p.returncode == 0, p.stderr

    assert json.loads((run / "config.json").read_text())["model"]["durations"] == "0,1,2,3,4"
    sql = "SELECT iteration, loss FROM iterations WHERE run_id = ? ORDER BY iteration"
    losses = _rows(run, sql)
    assert losses == _rows(ref, sql) and all(0 < row["loss"] < float("inf") for row in losses)
    a, b = load_checkpoint(ref)["model"], load_checkpoint(run)["model"]
    assert a["out.weight"].shape[0] == a["out.bias"].shape[0] == 30 + 5  # 30 characters, 5 durations
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sql = "SELECT epoch, split, final, loss, wer, cer FROM evals WHERE run_id = ? ORDER BY final, split, epoch"
    evals = _rows(run, sql)
    assert evals == _rows(ref, sql) and len(evals) >= 2
