"""One optimizer step: CTC, non-finite losses and impossible alignments."""
from types import SimpleNamespace

import pytest
import torch

from speechperf.config import load_preset
from speechperf.models import build_model
from speechperf.train.loop import Progress, TrainingDiverged, _optimizer, _step


def _batch(frames=(40, 30), label_lens=(5, 3)):
    g = torch.Generator().manual_seed(0)
    return SimpleNamespace(
        feats=torch.randn(len(frames), max(frames), 93, generator=g),
        feat_lens=torch.tensor(frames),
        labels=torch.randint(2, 28, (sum(label_lens),), generator=g),
        label_lens=torch.tensor(label_lens),
    )


def _setup(**over):
    cfg = load_preset("tiny", [f"{k}={v}" for k, v in over.items()])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    opt = _optimizer(model, cfg.train)
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    return cfg, model, opt, scaler


def test_step_reduces_loss_on_a_fixed_batch():
    cfg, model, opt, scaler = _setup()
    prog, batch = Progress(), _batch()
    first = _step(model, batch, opt, scaler, torch.device("cpu"), cfg.train, prog)[0]
    for _ in range(30):
        last = _step(model, batch, opt, scaler, torch.device("cpu"), cfg.train, prog)[0]
    assert last < first
    assert prog.skipped_steps == 0


def test_impossible_alignment_is_counted_not_averaged():
    cfg, model, opt, scaler = _setup()
    prog = Progress()
    # 15 frames -> 3 output frames, 10 labels: no CTC alignment exists (loss would be inf)
    batch = _batch(frames=(40, 15), label_lens=(5, 10))
    loss, _, _ = _step(model, batch, opt, scaler, torch.device("cpu"), cfg.train, prog)
    assert torch.isfinite(torch.tensor(loss))
    assert prog.impossible_utts == 1 and prog.skipped_steps == 0
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_nan_loss_skips_the_step_and_keeps_weights():
    cfg, model, opt, scaler = _setup(max_bad_losses=2)
    before = [p.detach().clone() for p in model.parameters()]
    prog, batch = Progress(), _batch()
    batch.feats[0, 3, 5] = float("nan")
    for _ in range(2):
        _step(model, batch, opt, scaler, torch.device("cpu"), cfg.train, prog)
    assert prog.skipped_steps == 2
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(TrainingDiverged, match="3 consecutive"):
        _step(model, batch, opt, scaler, torch.device("cpu"), cfg.train, prog)
    # a good batch resets the consecutive count
    prog2 = Progress(consecutive_bad=2)
    _step(model, _batch(), opt, scaler, torch.device("cpu"), cfg.train, prog2)
    assert prog2.consecutive_bad == 0
