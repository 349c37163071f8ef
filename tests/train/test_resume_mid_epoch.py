"""Exact resume from a checkpoint INSIDE an epoch, for a run that draws random numbers while
it trains (Conformer dropout, SpecAugment masks) and reads batches through DataLoader
worker processes: SIGKILLed after a mid-epoch checkpoint, the same command continues it to
the losses, weights and evaluations of the uninterrupted run, bit for bit.

A torch DataLoader draws its workers' base seed when its iterator is made; drawn from the
default generator, that number was taken before the checkpoint in the uninterrupted run and
again after the restore in the resumed one, shifting every later dropout and SpecAugment
draw. A kill on an epoch boundary (tests/train/test_every_model.py) cannot see it."""
import json
import os
import signal
import time

import pytest
import torch

from speechperf.results import ResultsDB
from speechperf.results.checkpoint import CheckpointError, load as load_checkpoint
from tests.conftest import cli, cli_start

CONFORMER = ["model.name=conformer", "model.d_model=16", "model.layers=1", "model.heads=2", "model.conv_kernel=3",
             "model.subsampling_channels=4", "model.dropout=0.1", "model.attention_dropout=0.1"]
AUGMENT = ["augment.freq_masks=1", "augment.freq_width=8", "augment.time_masks=2", "augment.time_width=10",
           "augment.time_ratio=0.2"]


def _args(feats, out):
    return ["train", "--preset", "tiny", "--data", str(feats), "--out", str(out), "--json", "threads=1",
            "max_epochs=2", "checkpoint_every=2", "sentence_every=50", "loader.readers=1", *CONFORMER, *AUGMENT]


def _rows(run, sql):
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    with ResultsDB(run / "results.db") as db:
        return db.query(sql, [run_id])


def _mid_epoch(run):
    try:
        return load_checkpoint(run)["progress"]["start_batch"] > 0
    except CheckpointError:  # none yet
        return False


def _kill_after_a_mid_epoch_checkpoint(p, run):
    """SIGKILL once the last checkpoint lies inside an epoch: stopped (SIGSTOP) when one is seen,
    checked again while stopped (an epoch-end one may have replaced it meanwhile), then killed."""
    while p.poll() is None:
        if _mid_epoch(run):
            os.kill(p.pid, signal.SIGSTOP)
            if _mid_epoch(run):
                os.kill(p.pid, signal.SIGKILL)
                return p.wait()
            os.kill(p.pid, signal.SIGCONT)
        time.sleep(0.005)
    pytest.fail(f"the run ended before a mid-epoch checkpoint: {p.stderr.read()}")


@pytest.mark.timeout(600)
def test_a_run_with_dropout_and_specaugment_resumes_bit_exactly_inside_an_epoch(tiny_features, tmp_path):
    ref, run = tmp_path / "ref", tmp_path / "run"
    p = cli(*_args(tiny_features, ref))
    assert p.returncode == 0, p.stderr

    p = cli_start(*_args(tiny_features, run))
    assert _kill_after_a_mid_epoch_checkpoint(p, run) == -signal.SIGKILL
    assert load_checkpoint(run)["progress"]["start_batch"] > 0  # the resume starts inside an epoch
    p = cli(*_args(tiny_features, run))
    assert p.returncode == 0, p.stderr

    sql = "SELECT iteration, loss FROM iterations WHERE run_id = ? ORDER BY iteration"
    assert _rows(run, sql) == _rows(ref, sql)  # every loss, bit for bit
    a, b = load_checkpoint(ref), load_checkpoint(run)
    assert a["model"].keys() == b["model"].keys() and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert torch.equal(a["rng"]["torch"], b["rng"]["torch"])  # the streams end where the uninterrupted run's end
    sql = "SELECT epoch, split, final, loss, wer, cer FROM evals WHERE run_id = ? ORDER BY final, split, epoch"
    assert _rows(run, sql) == _rows(ref, sql)
