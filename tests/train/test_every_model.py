"""Every registered model (ds2: by tests/train/test_faults.py), and one from outside the package (``MODULE:NAME``, imported again by
the continuing process from config.json), trains through the real ``speechperf train`` command
and resumes exactly: killed after a checkpoint, the same command continues it to the weights,
losses and evaluations of an uninterrupted run (CPU, one thread: bit for bit)."""
import json
import os
import signal

import pytest
import torch

from speechperf.models import MODELS
from speechperf.results import ResultsDB
from speechperf.results.checkpoint import CheckpointError, load as load_checkpoint
from tests.conftest import cli, cli_start
from tests.train.test_external_model_run import EXT, outside_env

# tiny sizes per model (``model.name=X`` starts from X's defaults: these narrow it)
SIZES = {
    "dnn": ["model.hidden=32", "model.layers=2"],
    "cldnn": ["model.conv_maps=4", "model.lstm_layers=1", "model.lstm_cells=16", "model.lstm_proj=8",
              "model.dnn_layers=1", "model.dnn_hidden=16"],  # one of each: its LSTMP runs unsubsampled frames
    "conformer": ["model.d_model=16", "model.layers=1", "model.heads=2", "model.conv_kernel=3",
                  "model.subsampling_channels=4"],
    "transducer": ["model.d_model=16", "model.layers=1", "model.heads=2", "model.conv_kernel=3",
                   "model.subsampling_channels=4", "model.pred_dim=16", "model.joint_dim=16"],
    "aed": ["model.d_model=16", "model.layers=1", "model.heads=2", "model.conv_kernel=3",
            "model.subsampling_channels=4", "model.dec_layers=1", "model.dec_heads=2"],  # greedy decoding: tokens up to 2 per encoder frame
    EXT: ["model.channels=16", "model.hidden=16"],  # tests/models/external_model.py
}


def _args(name, feats, out):
    return ["train", "--preset", "tiny", "--data", str(feats), "--out", str(out), "--json", "threads=1",
            "max_epochs=2", "checkpoint_every=3", "sentence_every=50", f"model.name={name}", *SIZES.get(name, [])]


def _rows(run, sql):
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    with ResultsDB(run / "results.db") as db:
        return db.query(sql, [run_id])


def _kill_after_first_checkpoint(p, run):
    while p.poll() is None:
        try:
            if load_checkpoint(run)["progress"]["iteration"] >= 3:
                os.kill(p.pid, signal.SIGKILL)
                return p.wait()
        except CheckpointError:
            pass
    pytest.fail(f"the run ended before its first checkpoint: {p.stderr.read()}")


@pytest.mark.timeout(600)
# ds2 (the tiny preset's own model) is killed and continued to the uninterrupted run bit for bit by
# tests/train/test_faults.py (a chain of SIGKILLs, SIGTERM, another thread count) and inside an epoch
# by tests/train/test_resume_mid_epoch.py: here, every other model
@pytest.mark.parametrize("name", [*(n for n in MODELS.names() if n != "ds2"), EXT])
def test_every_model_trains_and_resumes_exactly(name, tiny_features, tmp_path):
    ref, run, env = tmp_path / "ref", tmp_path / "run", outside_env()
    p = cli(*_args(name, tiny_features, ref), env=env)
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    summary = summary[0] if isinstance(summary, list) else summary
    assert summary["status"] in ("success", "max_epochs") and summary["iterations"] > 3

    p = cli_start(*_args(name, tiny_features, run), env=env)
    assert _kill_after_first_checkpoint(p, run) == -signal.SIGKILL
    p = cli(*_args(name, tiny_features, run), env=env)
    assert p.returncode == 0, p.stderr

    assert json.loads((run / "config.json").read_text())["model"]["name"] == name
    sql = "SELECT iteration, loss FROM iterations WHERE run_id = ? ORDER BY iteration"
    assert _rows(run, sql) == _rows(ref, sql)
    a, b = load_checkpoint(ref)["model"], load_checkpoint(run)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sql = "SELECT epoch, split, final, loss, wer, cer FROM evals WHERE run_id = ? ORDER BY final, split, epoch"
    assert _rows(run, sql) == _rows(ref, sql)
