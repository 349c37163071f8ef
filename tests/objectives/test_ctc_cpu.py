"""The CTC loss's CPU kernel (speechperf/objectives/ctc_cpu.py): its value against a sum over every
alignment and against torch's F.ctc_loss, its gradients against torch's in float64 and by gradcheck,
impossible and empty cases as torch treats them, the same bytes at any thread count, bad input."""
from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from speechperf.objectives import ctc_cpu
from speechperf.objectives.ctc import ctc_losses


def collapse(path) -> list[int]:
    out, prev = [], None
    for k in path:
        if k != prev and k != 0:
            out.append(k)
        prev = k
    return out


def brute_force(lp: torch.Tensor, labels: list[list[int]], tlen) -> list[float]:
    """-log of the sum over every frame-level path of each utterance that collapses to its labels."""
    T, B, C = lp.shape
    out = []
    for b in range(B):
        scores = [sum(float(lp[t, b, k]) for t, k in enumerate(path))
                  for path in itertools.product(range(C), repeat=int(tlen[b])) if collapse(path) == labels[b]]
        out.append(-float(torch.logsumexp(torch.tensor(scores, dtype=torch.float64), 0)) if scores else math.inf)
    return out


def batch(T=30, B=5, C=7, seed=0, dtype=torch.float32, lmin=3, lmax=12):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, C, generator=g, dtype=torch.float64).to(dtype)  # (T, B, C) logits
    tlen = torch.randint(T // 2, T + 1, (B,), generator=g)
    tlen[0] = T
    llen = torch.randint(lmin, lmax + 1, (B,), generator=g)
    labels = torch.randint(1, C, (int(llen.sum()),), generator=g)
    return x, labels, tlen, llen


def test_the_loss_is_the_sum_over_every_alignment():
    """Repeated labels (a blank must part them), an empty label sequence, one too long for its frames."""
    g = torch.Generator().manual_seed(3)
    lp = torch.randn(5, 4, 3, generator=g, dtype=torch.float64).log_softmax(-1)  # (T, B, C)
    labels = [[1, 1], [], [2, 1, 2], [1, 2, 1, 2, 1, 2]]
    tlen = torch.tensor([5, 4, 5, 5])
    flat = torch.tensor([k for row in labels for k in row])
    got = ctc_cpu.ctc_loss(lp, flat, tlen, torch.tensor([len(r) for r in labels]))
    want = brute_force(lp, labels, tlen)
    assert got.dtype == torch.float64 and math.isinf(got[3]) and math.isinf(want[3])
    assert got[:3].tolist() == pytest.approx(want[:3], rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_losses_and_gradients_match_torchs(dtype):
    x, labels, tlen, llen = batch(dtype=dtype)
    grads = []
    for loss in (lambda lp: ctc_cpu.ctc_loss(lp, labels, tlen, llen),
                 lambda lp: F.ctc_loss(lp, labels, tlen, llen, reduction="none")):
        xx = x.clone().requires_grad_()
        losses = loss(xx.log_softmax(-1))
        (losses * torch.arange(1, 6, dtype=dtype)).sum().backward()  # each utterance's own weight
        grads.append((losses.detach(), xx.grad))
    (mine, gm), (theirs, gt) = grads
    tol = 1e-10 if dtype == torch.float64 else 2e-4
    assert mine.dtype == dtype and torch.allclose(mine, theirs, rtol=1e-6 if dtype == torch.float32 else 1e-12)
    assert (gm - gt).abs().max() < tol
    assert (gm[int(tlen.min()):, tlen.argmin()] == 0).all()  # frames past an utterance's length: no gradient


def test_float32_gradients_are_closer_to_float64_than_torchs_own():
    """The kernel sums in float64: on float32 input its gradient is nearer the exact one."""
    x, labels, tlen, llen = batch(T=120, B=4, C=20, lmin=20, lmax=40)
    exact = x.double().requires_grad_()
    F.ctc_loss(exact.log_softmax(-1), labels, tlen, llen, reduction="none").sum().backward()
    errors = []
    for loss in (ctc_cpu.ctc_loss, lambda *a: F.ctc_loss(*a, reduction="none")):
        xx = x.clone().requires_grad_()
        loss(xx.log_softmax(-1), labels, tlen, llen).sum().backward()
        errors.append(float((xx.grad.double() - exact.grad).abs().max()))
    assert errors[0] < 1e-5 and errors[0] < errors[1] / 10, errors


def test_gradcheck():
    x, labels, tlen, llen = batch(T=8, B=3, C=4, dtype=torch.float64, lmin=1, lmax=3)
    lp = x.log_softmax(-1).detach().requires_grad_()  # any log-probabilities: the true derivative
    assert torch.autograd.gradcheck(lambda v: ctc_cpu.ctc_loss(v, labels, tlen, llen), (lp,))


def test_impossible_alignments_are_inf_or_zeroed_as_torchs():
    lp = torch.randn(4, 2, 5).log_softmax(-1).requires_grad_()
    labels, tlen, llen = torch.tensor([1, 1, 2, 3, 1]), torch.tensor([4, 4]), torch.tensor([2, 3])
    # [1, 1] needs 3 frames; [2, 3, 1] 3: both fit 4 ...
    assert torch.isfinite(ctc_cpu.ctc_loss(lp, labels, tlen, llen)).all()
    short = torch.tensor([2, 4])  # ... [1, 1] does not fit 2 frames
    mine = ctc_cpu.ctc_loss(lp, labels, short, llen).detach()
    theirs = F.ctc_loss(lp, labels, short, llen, reduction="none").detach()
    assert math.isinf(mine[0]) and math.isinf(theirs[0]) and torch.allclose(mine[1], theirs[1])
    zeroed = ctc_cpu.ctc_loss(lp, labels, short, llen, zero_infinity=True)
    assert zeroed[0] == 0
    zeroed.sum().backward()
    assert (lp.grad[:, 0] == 0).all() and lp.grad[:, 1].abs().sum() > 0
    assert math.isinf(ctc_cpu.ctc_loss(lp.detach(), labels, torch.tensor([0, 4]), llen)[0])  # no frames at all


def test_a_nan_stays_nan():
    """A NaN log-probability gives a NaN loss (the step's guard skips it), never inf zeroed to 0."""
    lp = torch.randn(6, 1, 4).log_softmax(-1)
    lp[2, 0, 1] = math.nan
    assert math.isnan(ctc_cpu.ctc_loss(lp, torch.tensor([1, 2]), torch.tensor([6]), torch.tensor([2]),
                                       zero_infinity=True)[0])


def test_padded_labels_give_the_same_losses():
    x, labels, tlen, llen = batch()
    padded = torch.zeros(len(llen), int(llen.max()), dtype=torch.long)
    for b, row in enumerate(labels.split(llen.tolist())):
        padded[b, :len(row)] = row
    lp = x.log_softmax(-1)
    assert torch.equal(ctc_cpu.ctc_loss(lp, padded, tlen, llen), ctc_cpu.ctc_loss(lp, labels, tlen, llen))
    padded[padded == 0] = -1  # padding is never read, whatever it holds (torch's rule): not a bad label
    assert torch.equal(ctc_cpu.ctc_loss(lp, padded, tlen, llen), ctc_cpu.ctc_loss(lp, labels, tlen, llen))


def test_the_same_bytes_at_any_thread_count(monkeypatch):
    """One utterance a thread: sums never split, so 1 and 2 threads give the same bits (curves)."""
    monkeypatch.setattr(ctc_cpu, "NODES_PER_THREAD", 1)  # a parallel region whatever the batch's size
    x, labels, tlen, llen = batch(T=200, B=9, C=30, lmin=40, lmax=80)
    lp = x.log_softmax(-1)
    before = torch.get_num_threads()
    out = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            out.append(ctc_cpu.losses_and_grad(lp, labels, tlen, llen))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])


@pytest.mark.parametrize("args,names", [
    ((torch.tensor([6, 7]), torch.tensor([2, 1])), "input lengths 6..7 outside 0..6 (the frames given)"),
    ((torch.tensor([6, 6]), torch.tensor([2, 2])), "label lengths (sum 4) beyond the 3 labels"),
    ((torch.tensor([6]), torch.tensor([2])), "1 input and 1 label lengths for a batch of 2"),
])
def test_bad_input_is_named(args, names):
    lp = torch.randn(6, 2, 4).log_softmax(-1)
    with pytest.raises(ValueError, match=names.replace("(", r"\(").replace(")", r"\)")):
        ctc_cpu.ctc_loss(lp, torch.tensor([1, 2, 3]), *args)
    with pytest.raises(ValueError, match="labels 1..4 outside the 4 classes"):
        ctc_cpu.ctc_loss(lp, torch.tensor([1, 4, 3]), torch.tensor([6, 6]), torch.tensor([2, 1]))


def test_the_setting_picks_the_kernel():
    """train.system.ctc_kernel: numba on CPU log-probabilities, torch's otherwise; the same losses."""
    x, labels, tlen, llen = batch()
    lp = x.log_softmax(-1)
    ours, torchs = (ctc_losses(lp, labels, tlen, llen, k, zero_infinity=False) for k in ("numba", "torch"))
    assert torch.allclose(ours, torchs, rtol=1e-6) and not torch.equal(ours, torchs)  # other float sums


def test_labels_far_under_the_blank_get_their_loss_in_log_space():
    """Log-probabilities hundreds of nats under the blank (a model far off): e^-800 is under float64's range,
    so the scaled recursion finds no path and the utterance is computed again in log space: torch's loss and
    gradient in float64, not inf."""
    x = torch.zeros(6, 2, 4, dtype=torch.float64)
    x[:, :, 1:] = -800.0  # every label 800 nats under the blank, in both utterances
    x[:, 1, 1:] = -3.0  # the second utterance in range: the scaled path
    labels, tlen, llen = torch.tensor([1, 2, 1, 2]), torch.tensor([6, 6]), torch.tensor([2, 2])
    grads = []
    for loss in (ctc_cpu.ctc_loss, lambda *a: F.ctc_loss(*a, reduction="none")):
        xx = x.clone().requires_grad_()
        out = loss(xx.log_softmax(-1), labels, tlen, llen)
        out.sum().backward()
        grads.append((out.detach(), xx.grad))
    (mine, gm), (theirs, gt) = grads
    assert torch.isfinite(mine).all() and mine[0] > 1500
    assert torch.allclose(mine, theirs, rtol=1e-12) and torch.allclose(gm, gt, atol=1e-10)
