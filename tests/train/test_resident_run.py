"""A run with its training split resident trains exactly as one that streams every epoch: the
same loss at every iteration, the same evaluations, with SpecAugment drawing from the run's RNG;
one whose buffer does not fit is refused before its folder exists."""
import json
import os
import signal

import pytest

from speechperf.data import resident as resident_mod
from speechperf.data.loader import load_index
from speechperf.data.resident import ResidentMemoryError
from speechperf.results import ResultsDB
from speechperf.train.loop import TrainRequest, train
from speechperf.train.stop import Interrupted

AUGMENT = ["augment.freq_masks=1", "augment.freq_width=8", "augment.time_masks=2", "augment.time_width=10",
           "augment.time_ratio=0.2"]
RUN = ["max_epochs=3", "threads=1", "device=cpu", "sentence_every=50", "checkpoint_every=50", "train.eval.decoder=greedy",
       "loader.readers=1", "train.floor.steps=2", *AUGMENT]


def _rows(out):
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    with ResultsDB(out / "results.db") as db:
        losses = db.query("SELECT iteration, epoch, loss, batch_size, frames FROM iterations WHERE run_id = ? "
                          "ORDER BY iteration", [run_id])
        evals = db.query("SELECT epoch, split, final, loss, cer, wer FROM evals WHERE run_id = ? "
                         "ORDER BY final, split, epoch", [run_id])
    return [tuple(r.values()) for r in losses], [tuple(r.values()) for r in evals]


@pytest.mark.timeout(900)
def test_resident_and_streaming_train_alike_loss_for_loss(tiny_features, tmp_path, monkeypatch):
    train(TrainRequest("tiny", tiny_features, tmp_path / "stream", [*RUN, "loader.resident=false"], quiet=True))
    cut, real = [], resident_mod.Resident.batch
    monkeypatch.setattr(resident_mod.Resident, "batch", lambda self, *a: cut.append(1) or real(self, *a))
    summary = train(TrainRequest("tiny", tiny_features, tmp_path / "resident", [*RUN, "loader.resident=true"], quiet=True))
    assert summary["floor"]["note"] is None  # replayed after the buffer was freed: the streaming batches
    (losses_s, evals_s), (losses_r, evals_r) = _rows(tmp_path / "stream"), _rows(tmp_path / "resident")
    assert len({r[0] for r in losses_s if r[0]}) == len(losses_s) > 10
    assert losses_r == losses_s  # every iteration's loss, bit for bit
    assert 0 < len(cut) == sum(1 for r in losses_r if r[1] > 1)  # epochs 2 and 3: cut from the buffer
    assert evals_r == evals_s and sum(1 for e in evals_s if not e[2]) == 3  # the CER trajectory, epoch by epoch

    # stopped (SIGTERM, saved) inside epoch 2; the same command continues it with no buffer yet: it
    # reads the whole split once, then trains as the uninterrupted runs did
    cut.clear()
    monkeypatch.setattr(resident_mod.Resident, "batch", lambda self, *a: (
        cut.append(1), len(cut) == 3 and os.kill(os.getpid(), signal.SIGTERM), real(self, *a))[-1])
    with pytest.raises(Interrupted, match="at iteration"):
        train(TrainRequest("tiny", tiny_features, tmp_path / "resumed", [*RUN, "loader.resident=true"], quiet=True))
    monkeypatch.setattr(resident_mod.Resident, "batch", real)
    read = []
    real_complete = resident_mod.Resident.complete
    monkeypatch.setattr(resident_mod.Resident, "complete", lambda self: (read.append(int((~self.have).sum())),
                                                                         real_complete(self)))
    train(TrainRequest("tiny", tiny_features, tmp_path / "resumed", [*RUN, "loader.resident=true"], quiet=True))
    assert read[0] == len(load_index(tiny_features, ["train-clean", "train-other"])) and not any(read[1:])
    assert _rows(tmp_path / "resumed") == (losses_s, evals_s)


def test_a_buffer_that_does_not_fit_is_refused_before_the_run_exists(tiny_features, tmp_path, monkeypatch):
    monkeypatch.setattr(resident_mod, "free_bytes", lambda device: (10**6, 10**7))
    with pytest.raises(ResidentMemoryError, match=r"loader.resident=true needs .* GB .*set loader.resident=false"):
        train(TrainRequest("tiny", tiny_features, tmp_path / "run", [*RUN, "loader.resident=true"], quiet=True))
    assert not (tmp_path / "run").exists()
    assert ResidentMemoryError.exit_code == 2
