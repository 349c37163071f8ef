"""One optimizer step: CTC, non-finite losses and impossible alignments, no host sync."""
import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from speechperf.config import load_preset
from speechperf.models import build_model
from speechperf.objectives.ctc_cpu import ctc_loss
from speechperf.results.progress import Progress
from speechperf.train.loop import TrainingDiverged
from speechperf.train.step import (StepMeter, copy_back_step, count_steps, make_optimizer, masked_step, read_point,
                                   train_step)
from tests.cuda_syncs import sync_warnings

CPU = torch.device("cpu")


def _batch(frames=(40, 30), label_lens=(5, 3)):
    g = torch.Generator().manual_seed(0)
    return SimpleNamespace(
        feats=torch.randn(len(frames), max(frames), 93, generator=g),
        feat_lens=torch.tensor(frames),
        labels=torch.randint(2, 28, (sum(label_lens),), generator=g),
        label_lens=torch.tensor(label_lens),
    )


def _setup(*over, device=CPU):
    cfg = load_preset("tiny", list(over))
    torch.manual_seed(0)
    model = build_model(cfg.model).to(device)
    opt = make_optimizer(model, cfg.train, device)
    scaler = torch.amp.GradScaler("cuda", enabled=cfg.train.system.precision == "fp16")
    return cfg, model, opt, scaler


def _steps(model, batch, opt, scaler, cfg, prog, n=1, device=CPU):
    """n steps read after each one (sync_every=1): the per-step host values."""
    losses = []
    for i in range(n):
        meter = StepMeter()
        out = train_step(model, batch, opt, scaler, device, cfg.train)
        prog.impossible_utts += out.impossible
        meter.add(i + 1, out)
        reads = meter.read()
        count_steps(prog, reads, cfg.train.stop.max_bad_losses)
        losses.append(reads[0].loss)
    return losses


def test_step_reduces_loss_on_a_fixed_batch():
    cfg, model, opt, scaler = _setup()
    prog = Progress()
    losses = _steps(model, _batch(), opt, scaler, cfg, prog, n=31)
    assert losses[-1] < losses[0]
    assert prog.skipped_steps == 0


def test_step_equals_the_plain_reference_step_bit_for_bit():
    """The sync-free step (CPU lengths, index batch norm, masked optimizer step) computes
    exactly what the plain step does: CTC mean (the run's default kernel, train.system.ctc_kernel), clip, AdamW."""
    cfg, model, opt, scaler = _setup()
    _, ref, ref_opt, _ = _setup()
    batch = _batch(frames=(40, 15, 33), label_lens=(5, 10, 4))  # one impossible utterance
    for _ in range(3):
        out = train_step(model, batch, opt, scaler, CPU, cfg.train)
        lp, ol = ref(batch.feats, batch.feat_lens)
        ok = ol >= batch.label_lens
        loss = ctc_loss(lp.float(), batch.labels, ol, batch.label_lens, zero_infinity=True).sum() / ok.sum()
        ref_opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), cfg.train.optim.grad_clip)
        ref_opt.step()
        assert torch.equal(out.loss, loss.detach()) and out.impossible == 1 and not out.bad
    for a, b in zip(model.parameters(), ref.parameters()):
        assert torch.equal(a, b)


def test_impossible_alignment_is_counted_not_averaged():
    cfg, model, opt, scaler = _setup()
    prog = Progress()
    # 15 frames -> 3 output frames, 10 labels: no CTC alignment exists (loss would be inf)
    (loss,) = _steps(model, _batch(frames=(40, 15), label_lens=(5, 10)), opt, scaler, cfg, prog)
    assert torch.isfinite(torch.tensor(loss))
    assert prog.impossible_utts == 1 and prog.skipped_steps == 0
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("optimizer", [["train.optim.name=adamw"], ["train.optim.name=adadelta"],
                                       ["train.optim.name=adamw", "train.optim.impl=fused"]])
def test_nan_loss_skips_the_step_and_keeps_weights_and_optimizer_state(optimizer):
    cfg, model, opt, scaler = _setup("max_bad_losses=2", *optimizer)
    good, bad = _batch(), _batch()
    bad.feats[0, 3, 5] = float("nan")
    prog = Progress()
    _steps(model, good, opt, scaler, cfg, prog)
    before = [p.detach().clone() for p in model.parameters()]
    state = {(i, k): v.clone() for i, p in enumerate(model.parameters()) for k, v in opt.state[p].items()}
    _steps(model, bad, opt, scaler, cfg, prog, n=2)
    assert prog.skipped_steps == 2
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(torch.equal(v, state[i, k]) for i, p in enumerate(model.parameters()) for k, v in opt.state[p].items())
    with pytest.raises(TrainingDiverged, match=r"3 consecutive .*iteration 1\)"):
        _steps(model, bad, opt, scaler, cfg, prog)
    # a good batch resets the consecutive count
    prog2 = Progress(consecutive_bad=2)
    _steps(model, good, opt, scaler, cfg, prog2)
    assert prog2.consecutive_bad == 0


def test_a_bad_first_step_leaves_a_fresh_optimizer():
    """A skipped first step undoes the state the step created: the next good step equals a
    fresh optimizer's first step."""
    cfg, model, opt, scaler = _setup()
    _, ref, ref_opt, _ = _setup()
    bad = _batch()
    bad.feats[1, 2, 0] = float("inf")
    prog = Progress()
    _steps(model, bad, opt, scaler, cfg, prog)
    assert prog.skipped_steps == 1
    _steps(model, _batch(), opt, scaler, cfg, Progress())
    _steps(ref, _batch(), ref_opt, scaler, cfg, Progress())
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters()))
    assert all(torch.equal(opt.state[a]["step"], ref_opt.state[b]["step"]) for a, b in zip(model.parameters(), ref.parameters()))


@pytest.mark.parametrize("how", ["cpu read", "fused", "copy back"])
def test_masked_step_keeps_or_undoes_exactly(how):
    """Each way of undoing a step: the CPU's host read (single-tensor AdamW), the fused kernel's
    found_inf, and the copy-back other devices use (run here on the CPU)."""
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = torch.optim.AdamW([w], lr=0.1, fused=how == "fused")
    step = copy_back_step if how == "copy back" else masked_step
    w.grad = torch.tensor([0.5, -0.5])
    step(opt, torch.tensor(False))
    assert torch.equal(w.detach(), torch.tensor([1.0, 2.0]))
    if how == "cpu read":  # skipped, not undone: the first kept step creates the state
        assert not opt.state[w]
    else:
        assert float(opt.state[w]["step"]) == 0 and torch.equal(opt.state[w]["exp_avg"], torch.zeros(2))
    step(opt, torch.tensor(True))
    assert float(opt.state[w]["step"]) == 1 and not torch.equal(w.detach(), torch.tensor([1.0, 2.0]))
    assert not hasattr(opt, "found_inf")  # the flag is the step's only


def test_the_cpu_read_and_the_copy_back_train_the_same_numbers():
    """masked_step's host read on a CPU against copy_back_step, kept and undone steps mixed: the
    same parameters and state bit for bit (why the reference curves made with the copy-back still
    reproduce)."""
    def make():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
        return model, torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)

    (read, ropt), (back, bopt) = make(), make()
    for i, ok in enumerate([False, True, True, False, True]):
        for model, opt, step in ((read, ropt, masked_step), (back, bopt, copy_back_step)):
            model.zero_grad()
            model(torch.randn(4, 5, generator=torch.Generator().manual_seed(i))).square().sum().backward()
            step(opt, torch.tensor(ok))
    assert all(torch.equal(a, b) for a, b in zip(read.parameters(), back.parameters()))
    for a, b in zip(read.parameters(), back.parameters()):
        assert all(torch.equal(ropt.state[a][k], v) for k, v in bopt.state[b].items())


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_a_fused_masked_step_equals_plain_steps_bit_for_bit(name):
    """The found_inf path of a fused optimizer: kept steps equal unmasked ones exactly, an
    undone one leaves parameters and state as they were (the plain path's contract)."""
    def make():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
        kw = {"weight_decay": 0.01, "fused": True}
        opt = torch.optim.AdamW(model.parameters(), lr=0.01, **kw) if name == "adamw" else \
            torch.optim.SGD(model.parameters(), lr=0.01, **kw)
        return model, opt

    def grads(model, i):
        model.zero_grad()
        model(torch.randn(4, 5, generator=torch.Generator().manual_seed(i))).square().sum().backward()

    masked, mopt = make()
    plain, popt = make()
    for i, ok in enumerate([True, False, True, True, False]):
        grads(masked, i)
        before = [p.detach().clone() for p in masked.parameters()]
        masked_step(mopt, torch.tensor(ok))
        if ok:
            grads(plain, i)
            popt.step()
            assert all(torch.equal(a, b) for a, b in zip(masked.parameters(), plain.parameters()))
        else:
            assert all(torch.equal(a, b) for a, b in zip(masked.parameters(), before))
    for a, b in zip(masked.parameters(), plain.parameters()):
        for k, v in popt.state[b].items():
            assert torch.equal(mopt.state[a][k], v), k


def test_accumulated_reads_equal_per_step_reads():
    """Steps read together at one point give the losses, skips and counters that reading
    every step gives (and the same weights: reading never changes the numbers)."""
    bad = _batch()
    bad.feats[0, 1, 1] = float("nan")
    batches = [_batch(), bad, bad, _batch(frames=(40, 15), label_lens=(5, 10)), bad, _batch()]
    cfg, m1, o1, s1 = _setup("max_bad_losses=5")
    p1 = Progress()
    per_step = [_steps(m1, b, o1, s1, cfg, p1)[0] for b in batches]
    _, m2, o2, s2 = _setup("max_bad_losses=5")
    p2, meter = Progress(), StepMeter()
    for i, b in enumerate(batches, 1):
        out = train_step(m2, b, o2, s2, CPU, cfg.train)
        p2.impossible_utts += out.impossible
        meter.add(i, out, {"iteration": i, "loss": None})
    reads = meter.read()
    count_steps(p2, reads, cfg.train.stop.max_bad_losses)
    assert meter.reads == 1 and not meter.pending
    assert [r.iteration for r in reads] == [1, 2, 3, 4, 5, 6] and [r.bad for r in reads] == [0, 1, 1, 0, 1, 0]
    assert [r.row["loss"] for r in reads] == [r.loss for r in reads]
    torch.testing.assert_close([r.loss for r in reads], per_step, rtol=0, atol=0, equal_nan=True)
    assert (p2.skipped_steps, p2.consecutive_bad, p2.impossible_utts) == (p1.skipped_steps, p1.consecutive_bad, p1.impossible_utts) == (3, 0, 1)
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))


def test_read_points():
    tc = load_preset("tiny", ["sync_every=10", "sentence_every=4", "checkpoint_every=6"]).train
    assert [i for i in range(1, 21) if read_point(i, tc)] == [4, 6, 8, 10, 12, 16, 18, 20]


# ---- CUDA variants ----------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_step_on_cuda_learns_in_every_precision(precision):
    dev = torch.device("cuda", 0)
    cfg, model, opt, scaler = _setup(f"precision={precision}", device=dev)
    prog = Progress()
    losses = _steps(model, _batch(), opt, scaler, cfg, prog, n=20, device=dev)
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    # fp16: the scaler starts at 2**16 and halves after each overflow, skipping those steps
    assert prog.skipped_steps == 0 if precision != "fp16" else prog.skipped_steps < 10


def _sync_warnings(fn) -> int:
    """Host synchronizations ``fn`` makes, as counted by CUDA sync debug mode."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return len(sync_warnings(caught))


@pytest.mark.cuda
def test_steps_between_read_points_add_no_host_sync_beyond_ctc():
    """Between reads the loop's steps sync only where torch's CUDA CTC copies its length
    lists (forward and backward), counted here on CTC alone; the read is one more."""
    dev = torch.device("cuda", 0)
    cfg, model, opt, scaler = _setup("precision=bf16", device=dev)
    batch, meter = _batch(), StepMeter()
    train_step(model, batch, opt, scaler, dev, cfg.train)  # warm-up: lazy init, optimizer state

    labels = batch.labels.to(dev)

    def ctc_alone():  # the step's call: CPU lengths, no reduction, zero_infinity
        lp = torch.randn(batch.feats.shape[1] // 2, 2, 30, device=dev, requires_grad=True).log_softmax(-1)
        F.ctc_loss(lp, labels, torch.tensor([15, 10]), batch.label_lens, reduction="none",
                   zero_infinity=True).sum().backward()

    per_ctc = _sync_warnings(ctc_alone)
    steps = _sync_warnings(lambda: [meter.add(i, train_step(model, batch, opt, scaler, dev, cfg.train)) for i in range(5)])
    assert steps <= 5 * per_ctc, f"{steps} syncs in 5 steps, CTC alone makes {per_ctc} per step"
    assert _sync_warnings(meter.read) == 1


def test_specaugment_masks_the_step_input_from_the_run_rng_only_when_asked():
    """The step trains on masked features when ``augment`` has masks: the loss differs from
    the plain step's, is the same for the same RNG state, and the batch itself is untouched."""
    from speechperf.data.specaugment import SpecAugmentConfig

    batch = _batch()
    before = batch.feats.clone()
    algoperf = SpecAugmentConfig(freq_masks=2, time_masks=10)
    losses = []
    for augment in (None, SpecAugmentConfig(), algoperf, algoperf):
        cfg, model, opt, scaler = _setup()  # seeds the RNG: the masked steps draw the same masks
        losses.append(float(train_step(model, batch, opt, scaler, CPU, cfg.train, augment).loss))
    plain, off, masked, again = losses
    assert plain == off  # no masks: the exact plain step (and nothing drawn)
    assert masked != plain and masked == again
    assert torch.equal(batch.feats, before)
