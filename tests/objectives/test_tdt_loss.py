"""The TDT loss (speechperf/objectives/tdt_loss.py): its value against an independent enumeration of
every TDT path, the monotonic transducer it is with durations {1}, gradients by gradcheck, the numba
CPU kernel against the pure-torch reference, the CUDA kernels in numba's simulator against the CPU
kernel, impossible utterances and bad inputs."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from speechperf.objectives import tdt_cpu, tdt_cuda
from speechperf.objectives.rnnt_loss import RNNTInputError
from speechperf.objectives.tdt_loss import TDTLossFunction, kernel_forward, possible, tdt_loss
from speechperf.objectives.tdt_reference import tdt_loss_reference

SETS = [(0, 1, 2, 3, 4), (1, 2, 3, 4), (0, 1), (1,), (0, 2), (2, 3)]


def paths(T: int, U: int, durations) -> list[list[tuple]]:
    """Every TDT path of an utterance as its arcs (t, u, token 'b' or 'y', duration index), by depth-first
    search from (0, 0): a label to (t+d, u+1) inside the frames, a blank (d >= 1) to (t+d, u), the last a
    blank landing exactly on T from (T-d, U)."""
    out = []

    def walk(t, u, arcs):
        for k, d in enumerate(durations):
            if d > 0 and t + d == T and u == U:
                out.append(arcs + [(t, u, "b", k)])
            if d > 0 and t + d < T:
                walk(t + d, u, arcs + [(t, u, "b", k)])
            if u < U and t + d < T:
                walk(t + d, u + 1, arcs + [(t, u, "y", k)])

    if T > 0:
        walk(0, 0, [])
    return out


def brute_force(lp, lpd, targets, tlen, ulen, durations, blank: int, sigma: float = 0.0) -> list[float]:
    """-log of the sum over every path's product of token and duration probabilities, per utterance."""
    out = []
    for b in range(lp.shape[0]):
        scores = [sum(float(lp[b, t, u, blank if kind == "b" else targets[b, u]]) - sigma + float(lpd[b, t, u, k])
                      for t, u, kind, k in p) for p in paths(int(tlen[b]), int(ulen[b]), durations)]
        out.append(-float(torch.logsumexp(torch.tensor(scores, dtype=torch.float64), 0)) if scores else math.inf)
    return out


def batch(B=3, T=5, U=3, V=5, D=5, seed=0, dtype=torch.float32, tlen=(5, 3, 4), ulen=(3, 1, 0), blank=0):
    """Random logits (B, T, U+1, V+D), targets never blank padded with -1, the lengths given."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, U + 1, V + D, generator=g, dtype=torch.float64).to(dtype)
    labels = [v for v in range(V) if v != blank]
    targets = torch.tensor(labels)[torch.randint(0, len(labels), (B, U), generator=g)]
    ulen_t = torch.tensor(ulen)
    targets[torch.arange(U)[None, :] >= ulen_t[:, None]] = -1
    return logits, targets, torch.tensor(tlen), ulen_t


def split(logits, D):
    x = logits.double()
    return torch.log_softmax(x[..., :-D], -1), torch.log_softmax(x[..., -D:], -1)


@pytest.mark.parametrize("durations", SETS)
@pytest.mark.parametrize("fused", [True, False])
def test_the_loss_is_the_sum_over_every_path(durations, fused):
    D = len(durations)
    logits, targets, tlen, ulen = batch(D=D, tlen=(5, 3, 4), ulen=(3, 1, 0), blank=2)
    lp, lpd = split(logits, D)
    want = brute_force(lp, lpd, targets, tlen, ulen, durations, blank=2)
    given = logits if fused else torch.cat([lp, lpd], -1).float()
    for loss in (tdt_loss, tdt_loss_reference):
        got = loss(given, targets, tlen, ulen, durations, blank=2, fused_log_softmax=fused)
        assert got.dtype == torch.float32 and got.shape == (3,)
        assert got.tolist() == pytest.approx(want, rel=1e-5), (loss.__name__, durations)
    assert [math.isfinite(w) for w in want] == possible(tlen, ulen, durations).tolist()


def test_sigma_lowers_every_token_log_probability():
    logits, targets, tlen, ulen = batch(seed=3)
    lp, lpd = split(logits, 5)
    want = brute_force(lp, lpd, targets, tlen, ulen, SETS[0], blank=0, sigma=0.05)
    for loss in (tdt_loss, tdt_loss_reference):
        assert loss(logits, targets, tlen, ulen, SETS[0], sigma=0.05).tolist() == pytest.approx(want, rel=1e-5)
    assert tdt_loss(logits, targets, tlen, ulen, SETS[0], sigma=0.05).sum() > tdt_loss(logits, targets, tlen, ulen,
                                                                                       SETS[0]).sum()


def test_durations_one_is_the_monotonic_transducer():
    """{1}: one symbol per frame, U labels among the first T - 1 frames and blanks elsewhere, the last a
    blank; the duration's probability is 1 whatever its logit."""
    logits, targets, tlen, ulen = batch(D=1, T=6, tlen=(6, 3, 2), ulen=(3, 3, 1))
    lp = torch.log_softmax(logits[..., :-1].double(), -1)
    want = []
    for b in range(3):
        T, U = int(tlen[b]), int(ulen[b])
        scores = []
        for at in itertools.combinations(range(T - 1), U):
            u, s = 0, 0.0
            for t in range(T):
                if t in at:
                    s, u = s + float(lp[b, t, u, targets[b, u]]), u + 1
                else:
                    s += float(lp[b, t, u, 0])
            scores.append(s)
        want.append(-float(torch.logsumexp(torch.tensor(scores, dtype=torch.float64), 0)) if scores else math.inf)
    assert want[1] == math.inf  # 3 labels and the final blank need 4 frames, not 3
    shifted = logits.clone()
    shifted[..., -1] += 7.0
    for loss in (tdt_loss, tdt_loss_reference):
        assert loss(logits, targets, tlen, ulen, (1,)).tolist() == pytest.approx(want, rel=1e-5)
        assert loss(shifted, targets, tlen, ulen, (1,)).tolist() == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("durations", [(0, 1, 2, 3, 4), (1, 2, 3, 4), (0, 2)])
@pytest.mark.parametrize("fused", [True, False])
def test_gradients_by_gradcheck(durations, fused):
    D = len(durations)
    logits, targets, tlen, ulen = batch(B=3, T=5, U=2, V=4, D=D, dtype=torch.float64, tlen=(5, 4, 2), ulen=(2, 1, 2))
    if not fused:
        logits = torch.cat([torch.log_softmax(logits[..., :-D], -1), torch.log_softmax(logits[..., -D:], -1)], -1)
    logits.requires_grad_()

    def loss(x):
        c = TDTLossFunction.apply(x, targets, tlen, ulen, durations, 0, fused, 0.02, False)
        return torch.where(torch.isfinite(c), c, 0.0)

    assert torch.autograd.gradcheck(loss, (logits,), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("durations", SETS[:3])
def test_the_cpu_kernel_equals_the_reference_and_ignores_padding(durations):
    D = len(durations)
    logits, targets, tlen, ulen = batch(B=5, T=14, U=5, V=9, D=D, seed=1, tlen=(14, 7, 1, 9, 3),
                                        ulen=(5, 2, 4, 0, 3))
    for b, (t, u) in enumerate(zip(tlen.tolist(), ulen.tolist())):  # padding's logits made absurd
        logits[b, t:] = 1e4
        logits[b, :, u + 1:] = -1e4
    weights = torch.tensor([1.0, -2.0, 0.5, 3.0, 1.5])
    a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    got, want = tdt_loss(a, targets, tlen, ulen, durations), tdt_loss_reference(b, targets, tlen, ulen, durations)
    torch.testing.assert_close(got, want)
    keep = torch.isfinite(want)
    (torch.where(keep, got, 0.0) * weights).sum().backward()
    (torch.where(keep, want, 0.0) * weights).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, atol=2e-6, rtol=1e-4)
    assert a.grad[0].abs().sum() > 0 and a.grad[1, 7:].abs().max() == 0 and a.grad[1, :, 3:].abs().max() == 0
    assert torch.isfinite(a.grad).all()


def test_impossible_utterances_give_inf_and_no_gradient():
    logits, targets, tlen, ulen = batch(D=4, tlen=(0, 3, 2), ulen=(2, 1, 2))  # (1..4): 2 labels + blank need 3
    for loss in (tdt_loss, tdt_loss_reference):
        x = logits.clone().requires_grad_()
        cost = loss(x, targets, tlen, ulen, (1, 2, 3, 4))
        c = cost.tolist()
        assert c[0] == math.inf and c[2] == math.inf and math.isfinite(c[1])
        torch.where(torch.isfinite(cost), cost, 0.0).sum().backward()
        assert x.grad[0].abs().max() == 0 and x.grad[2].abs().max() == 0 and x.grad[1].abs().max() > 0
        assert torch.isfinite(x.grad).all(), loss.__name__
    assert possible(tlen, ulen, (1, 2, 3, 4)).tolist() == [False, True, False]
    assert possible(tlen, ulen, (0, 1)).tolist() == [False, True, True]


def test_half_precision_logits_give_their_dtype_back():
    logits, targets, tlen, ulen = batch(B=2, T=6, U=3, V=7, seed=2, tlen=(6, 4), ulen=(3, 2))
    full = logits.clone().requires_grad_()
    tdt_loss(full, targets, tlen, ulen, SETS[0], reduction="sum").backward()
    x = logits.to(torch.bfloat16).requires_grad_()
    cost = tdt_loss(x, targets, tlen, ulen, SETS[0], reduction="sum")
    cost.backward()
    assert cost.dtype == torch.float32 and x.grad.dtype == torch.bfloat16
    torch.testing.assert_close(x.grad.float(), full.grad, atol=0.02, rtol=0.05)


@pytest.mark.parametrize("durations, named", [
    ((), r"durations=\[\] must be distinct"), ((0,), r"durations=\[0\]"), ((1, 1), r"durations=\[1, 1\]"),
    ((-1, 1), r"durations=\[-1, 1\]"),
])
def test_bad_durations_are_refused_naming_them(durations, named):
    logits, targets, tlen, ulen = batch()
    with pytest.raises(RNNTInputError, match=named):
        tdt_loss(logits, targets, tlen, ulen, durations)


def test_bad_inputs_are_refused_naming_the_value():
    logits, targets, tlen, ulen = batch()
    with pytest.raises(RNNTInputError, match=r"target_lengths\[0\]=4 outside 0\.\.3"):
        tdt_loss(logits, targets, tlen, torch.tensor([4, 1, 0]), SETS[0])
    with pytest.raises(RNNTInputError, match=r"blank=5 outside the vocabulary of 5"):
        tdt_loss(logits, targets, tlen, ulen, SETS[0], blank=5)  # 10 logits: 5 tokens, 5 durations
    with pytest.raises(RNNTInputError, match=r"expected \(B, T, U\+1, V\+D\)"):
        tdt_loss(logits[..., :5], targets, tlen, ulen, SETS[0])


@pytest.mark.parametrize("durations", [(0, 1, 2, 3, 4), (1, 2)])
def test_cuda_kernels_in_the_simulator_equal_the_cpu_kernel(durations):
    """The CUDA kernels run by numba's CUDA simulator (no GPU), row blocks of 4 threads over V = 5 and
    recursion blocks of 2 over U + 1 = 3 so that both stride loops wrap; in place (a half-precision
    joint's buffer) with the fused softmaxes and sigma, into a new buffer without."""
    D = len(durations)
    logits, targets, tlen, ulen = batch(B=4, T=4, U=2, V=5, D=D, seed=4, tlen=(4, 2, 0, 2), ulen=(2, 0, 1, 2))
    args = (targets.numpy(), tlen.numpy(), ulen.numpy(), np.array(durations), 0)
    for fused, inplace, sigma in ((True, True, 0.05), (False, False, 0.0)):
        acts = (logits if fused else torch.cat(split(logits, D), -1).float()).numpy()
        want_grads = np.empty_like(acts)
        want = tdt_cpu.run(acts, want_grads, *args, fused, sigma)
        work = acts.copy()
        grads = work if inplace else np.full_like(acts, np.nan)
        got = tdt_cuda.simulate(work, grads, *args, fused, sigma, threads=4, lattice=2)
        np.testing.assert_allclose(got, want, rtol=1e-6)
        np.testing.assert_allclose(grads, want_grads, atol=1e-6)
        assert np.isinf(want[2]) and (durations[0] != 1 or np.isinf(want[3]))  # no frames; 2 labels in 2 frames


def test_the_cuda_kernels_compile_for_a_gpu():
    """numba.cuda types and compiles the three kernels and their helpers to PTX for sm_90 (no GPU needed,
    but NVVM: the simulator runs them as Python and would not see a typing error the real compiler makes)."""
    from numba import cuda, types

    f32, f64, i64 = types.float32, types.float64, types.int64
    acts, lat, hold = types.Array(f32, 4, "C"), types.Array(f64, 3, "C"), types.Array(f32, 3, "C")
    lat4, tgt, lens, ll = types.Array(f64, 4, "C"), types.Array(i64, 2, "C"), types.Array(i64, 1, "C"), \
        types.Array(f64, 1, "C")
    sigs = {tdt_cuda.rows_kernel: (acts, tgt, lens, lens, i64, types.boolean, f64, acts, lat, lat, lat4, lat, hold),
            tdt_cuda.alpha_beta_kernel: (lens, lat, lat, lat4, lens, lens, lat, lat, ll),
            tdt_cuda.grads_kernel: (lens, tgt, lens, lens, i64, types.boolean, lat, lat, lat, lat, lat4, lat, ll, hold,
                                    acts)}
    tdt_cuda.use_helpers(lambda f: cuda.jit(f, device=True, inline=True))
    try:
        for kernel, sig in sigs.items():
            try:
                ptx, _ = cuda.compile_ptx(kernel, sig, cc=(9, 0))
            except Exception as e:  # noqa: BLE001 - numba's errors for a missing NVVM vary by version
                if "nvvm" in str(e).lower() or "nvrtc" in str(e).lower() or "cuda" in type(e).__module__.lower():
                    pytest.skip(f"no NVVM to compile with here: {type(e).__name__}")
                raise
            assert ".entry" in ptx, kernel.__name__
    finally:
        tdt_cuda.use_helpers(lambda f: f)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cuda_kernels_equal_the_cpu_kernel_on_a_gpu(dtype):
    logits, targets, tlen, ulen = batch(B=4, T=40, U=12, V=300, seed=6, tlen=(40, 17, 0, 33), ulen=(12, 3, 5, 0))
    targets = targets.clamp(min=1)
    logits = logits.to(dtype)
    want, want_grad = kernel_forward(logits, targets, tlen, ulen, SETS[0], 0, True, 0.0)
    got, grad = kernel_forward(logits.cuda(), targets, tlen, ulen, SETS[0], 0, True, 0.0)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(grad.float().cpu(), want_grad.float(), atol=1e-2 if dtype == torch.bfloat16 else 1e-5,
                               rtol=1e-2 if dtype == torch.bfloat16 else 1e-4)
