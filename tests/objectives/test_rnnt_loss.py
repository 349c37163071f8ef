"""The RNN-T loss (speechperf/objectives/rnnt_loss.py): its value against a sum over every alignment,
against the published warp-transducer/torchaudio example, its gradients by gradcheck; the numba CPU
kernel against the pure-torch reference; the CUDA kernels, run by numba's CUDA simulator, against
the CPU kernel; T = 0 and bad inputs."""
from __future__ import annotations

import itertools
import math
import os

import numba
import numpy as np
import pytest
import torch

from speechperf.errors import SpeechperfError
from speechperf.objectives import rnnt_cpu, rnnt_cuda
from speechperf.objectives.rnnt_loss import RNNTInputError, RNNTLossFunction, joint_bytes, rnnt_loss
from speechperf.objectives.rnnt_reference import rnnt_loss_reference


def brute_force(lp: torch.Tensor, targets, tlen, ulen, blank: int) -> list[float]:
    """-log of the sum over every path of each utterance, from log-probabilities ``lp`` (B, T, U+1, V):
    the labels' places among the first T_b - 1 + U_b steps, then the final blank at (T_b - 1, U_b)."""
    out = []
    for b in range(lp.shape[0]):
        T, U = int(tlen[b]), int(ulen[b])
        if T == 0:
            out.append(math.inf)
            continue
        paths = []
        for labels_at in itertools.combinations(range(T - 1 + U), U):
            t = u = 0
            score = 0.0
            for step in range(T - 1 + U):
                if step in labels_at:
                    score += float(lp[b, t, u, targets[b, u]])
                    u += 1
                else:
                    score += float(lp[b, t, u, blank])
                    t += 1
            paths.append(score + float(lp[b, T - 1, U, blank]))
        out.append(-float(torch.logsumexp(torch.tensor(paths, dtype=torch.float64), 0)))
    return out


def batch(B=3, T=4, U=3, V=5, seed=0, dtype=torch.float32, tlen=(4, 2, 3), ulen=(3, 1, 0), blank=0):
    """Random logits (B, T, U+1, V), targets never blank padded with -1, the lengths given."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, U + 1, V, generator=g, dtype=torch.float64).to(dtype)
    labels = [v for v in range(V) if v != blank]
    targets = torch.tensor(labels)[torch.randint(0, len(labels), (B, U), generator=g)]
    ulen_t = torch.tensor(ulen)
    targets[torch.arange(U)[None, :] >= ulen_t[:, None]] = -1  # padding: never read
    return logits, targets, torch.tensor(tlen), ulen_t


@pytest.mark.parametrize("fused", [True, False])
def test_the_loss_is_the_sum_over_every_alignment(fused):
    logits, targets, tlen, ulen = batch(tlen=(4, 2, 3), ulen=(3, 1, 0), blank=2)
    lp = torch.log_softmax(logits.double(), -1)
    want = brute_force(lp, targets, tlen, ulen, blank=2)
    given = logits if fused else lp.float()
    for loss in (rnnt_loss, rnnt_loss_reference):
        got = loss(given, targets, tlen, ulen, blank=2, fused_log_softmax=fused)
        assert got.dtype == torch.float32 and got.shape == (3,)
        assert got.tolist() == pytest.approx(want, rel=1e-5), loss.__name__


# warp-transducer's small_test, the example torchaudio's and NeMo's RNN-T tests share: logits (1, 2, 3, 5),
# labels [1, 2], blank 0; its cost and its gradients w.r.t. the logits (fused) and the log-probabilities
SMALL = [[[0.1, 0.6, 0.1, 0.1, 0.1], [0.1, 0.1, 0.6, 0.1, 0.1], [0.1, 0.1, 0.2, 0.8, 0.1]],
         [[0.1, 0.6, 0.1, 0.1, 0.1], [0.1, 0.1, 0.2, 0.1, 0.1], [0.7, 0.1, 0.2, 0.1, 0.1]]]
SMALL_COST = 4.495666
SMALL_GRAD_LOGITS = [[[-0.13116688, -0.3999269, 0.17703125, 0.17703125, 0.17703125],
                      [-0.18572757, 0.12247056, -0.18168412, 0.12247056, 0.12247056],
                      [-0.32091254, 0.06269141, 0.06928472, 0.12624499, 0.06269141]],
                     [[0.05456069, -0.21824276, 0.05456069, 0.05456069, 0.05456069],
                      [0.12073959, 0.12073959, -0.48295835, 0.12073959, 0.12073959],
                      [-0.6925882, 0.16871116, 0.18645467, 0.16871116, 0.16871116]]]
SMALL_GRAD_LOG_PROBS = [[[-0.308198071906, -0.691801928094, 0, 0, 0], [-0.308198071906, 0, -0.383603856188, 0, 0],
                         [-0.383603856188, 0, 0, 0, 0]],
                        [[0, -0.308198071906, 0, 0, 0], [0, 0, -0.616396143812, 0, 0], [-1.0, 0, 0, 0, 0]]]


@pytest.mark.parametrize("fused", [True, False])
def test_the_published_small_example(fused):
    x = torch.tensor([SMALL])
    x = (x if fused else torch.log_softmax(x, -1)).requires_grad_()
    cost = rnnt_loss(x, torch.tensor([[1, 2]]), torch.tensor([2]), torch.tensor([2]), reduction="sum",
                     fused_log_softmax=fused)
    cost.backward()
    assert float(cost.detach()) == pytest.approx(SMALL_COST, rel=1e-6)
    want = torch.tensor([SMALL_GRAD_LOGITS if fused else SMALL_GRAD_LOG_PROBS])
    torch.testing.assert_close(x.grad, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("fused", [True, False])
def test_gradients_by_gradcheck(fused):
    logits, targets, tlen, ulen = batch(B=2, T=3, U=2, V=4, dtype=torch.float64, tlen=(3, 2), ulen=(2, 1))
    if not fused:
        logits = torch.log_softmax(logits, -1)
    logits.requires_grad_()

    def loss(x):
        return RNNTLossFunction.apply(x, targets, tlen, ulen, 0, fused, False)

    assert torch.autograd.gradcheck(loss, (logits,), eps=1e-6, atol=1e-6)


def test_the_cpu_kernel_equals_the_reference_and_ignores_padding():
    logits, targets, tlen, ulen = batch(B=4, T=12, U=5, V=9, seed=1, tlen=(12, 7, 1, 9), ulen=(5, 2, 4, 0))
    for b, (t, u) in enumerate(zip(tlen.tolist(), ulen.tolist())):  # padding's logits made absurd
        logits[b, t:] = 1e4
        logits[b, :, u + 1:] = -1e4
    for fused in (True, False):
        x = logits if fused else torch.log_softmax(logits, -1).masked_fill(logits.abs() == 1e4, 7.0)
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        weights = torch.tensor([1.0, -2.0, 0.5, 3.0])  # a gradient per utterance, as the mean of a batch is not
        (rnnt_loss(a, targets, tlen, ulen, fused_log_softmax=fused) * weights).sum().backward()
        (rnnt_loss_reference(b, targets, tlen, ulen, fused_log_softmax=fused) * weights).sum().backward()
        want = rnnt_loss_reference(x, targets, tlen, ulen, fused_log_softmax=fused)
        torch.testing.assert_close(rnnt_loss(x, targets, tlen, ulen, fused_log_softmax=fused), want)
        torch.testing.assert_close(a.grad, b.grad, atol=2e-6, rtol=1e-4)
        assert a.grad[0, :, :6].abs().sum() > 0 and a.grad[1, 7:].abs().max() == 0 and a.grad[1, :, 3:].abs().max() == 0
    for reduction in ("mean", "sum"):
        torch.testing.assert_close(rnnt_loss(logits, targets, tlen, ulen, reduction=reduction),
                                   rnnt_loss_reference(logits, targets, tlen, ulen, reduction=reduction))


def test_half_precision_logits_give_their_dtype_back():
    logits, targets, tlen, ulen = batch(B=2, T=6, U=3, V=7, seed=2, tlen=(6, 4), ulen=(3, 2))
    full = logits.clone().requires_grad_()
    rnnt_loss(full, targets, tlen, ulen, reduction="sum").backward()
    for dtype in (torch.bfloat16, torch.float16):
        x = logits.to(dtype).requires_grad_()
        cost = rnnt_loss(x, targets, tlen, ulen, reduction="sum")
        cost.backward()
        assert cost.dtype == torch.float32 and x.grad.dtype == dtype
        want = rnnt_loss(logits.to(dtype).float(), targets, tlen, ulen, reduction="sum")  # the same logits in fp32
        assert float(cost.detach()) == pytest.approx(float(want), rel=1e-6)
        torch.testing.assert_close(x.grad.float(), full.grad, atol=0.02, rtol=0.05)


def test_the_backward_scales_its_one_buffer_in_place():
    logits, targets, tlen, ulen = batch()
    x = logits.clone().requires_grad_()
    cost = rnnt_loss(x, targets, tlen, ulen)
    assert cost.grad_fn.saved_tensors[0].shape == logits.shape  # the one (B, T, U+1, V) tensor kept
    (cost * torch.tensor([2.0, 0.0, -1.0])).sum().backward(retain_graph=True)
    y = logits.clone().requires_grad_()
    (rnnt_loss_reference(y, targets, tlen, ulen) * torch.tensor([2.0, 0.0, -1.0])).sum().backward()
    torch.testing.assert_close(x.grad, y.grad, atol=2e-6, rtol=1e-4)
    with pytest.raises(RuntimeError, match="inplace"):  # a second backward would scale the scaled buffer
        cost.sum().backward()


def test_no_frames_gives_inf_and_no_gradient():
    logits, targets, tlen, ulen = batch(tlen=(0, 3, 0), ulen=(2, 1, 0))
    for loss in (rnnt_loss, rnnt_loss_reference):
        x = logits.clone().requires_grad_()
        cost = loss(x, targets, tlen, ulen)
        c = cost.tolist()
        assert c[0] == math.inf and c[2] == math.inf and math.isfinite(c[1])
        cost.sum().backward()  # the caller's sum: the infinite ones add no gradient
        assert x.grad[0].abs().max() == 0 and x.grad[2].abs().max() == 0 and x.grad[1].abs().max() > 0
        assert torch.isfinite(x.grad).all(), loss.__name__
        assert loss(x, targets, tlen, ulen, reduction="mean").item() == math.inf


def test_cuda_kernels_in_the_simulator_equal_the_cpu_kernel():
    """The CUDA kernels run by numba's CUDA simulator (no GPU), row blocks of 4 threads over V = 5 and
    recursion blocks of 2 over U + 1 = 3 so that both stride loops wrap; in place (a half-precision
    joint's buffer) with the fused softmax, into a new buffer without."""
    logits, targets, tlen, ulen = batch(B=3, T=3, U=2, V=5, seed=4, tlen=(3, 2, 0), ulen=(2, 0, 1))
    args = (targets.numpy(), tlen.numpy(), ulen.numpy(), 0)
    for fused, inplace in ((True, True), (False, False)):
        acts = (logits if fused else torch.log_softmax(logits, -1)).numpy()
        want_grads = np.empty_like(acts)
        want = rnnt_cpu.run(acts, want_grads, *args, fused)
        work = acts.copy()
        grads = work if inplace else np.full_like(acts, np.nan)
        got = rnnt_cuda.simulate(work, grads, *args, fused, threads=4, lattice=2)
        np.testing.assert_allclose(got, want, rtol=1e-6)
        np.testing.assert_allclose(grads, want_grads, atol=1e-6)


def test_a_float32_lattice_blurs_the_posteriors_where_float64_does_not():
    """Why the lattice is float64: at T=300, U=60 alpha + beta is ~ -1100, where a float32's step is
    1e-4, and the gradient's posteriors exp(alpha + beta - ll) carry that error (5e-5 here); a float64
    lattice's gradient equals the float64 reference's to float32's precision (5e-8)."""
    logits, targets, tlen, ulen = batch(B=1, T=300, U=60, V=4, seed=5, tlen=(300,), ulen=(60,))
    x = logits.double().requires_grad_()
    rnnt_loss_reference(x, targets, tlen, ulen).sum().backward()
    args = (targets.numpy().astype(np.int64), tlen.numpy(), ulen.numpy(), 0, True)
    err = {}
    for dt in (np.float32, np.float64):
        grads = np.empty(logits.shape, np.float32)
        rnnt_cpu.run(logits.numpy(), grads, *args, dtype=dt)
        err[dt] = float(np.abs(grads - x.grad.numpy()).max())
    assert err[np.float64] < 1e-6 and err[np.float32] > 1e-5 and err[np.float32] > 100 * err[np.float64], err


@pytest.mark.parametrize("change, named", [
    ({"ulen": torch.tensor([4, 1, 0])}, r"target_lengths\[0\]=4 outside 0\.\.3"),
    ({"tlen": torch.tensor([4, -1, 3])}, r"logit_lengths\[1\]=-1 outside 0\.\.4"),
    ({"blank": 5}, r"blank=5 outside the vocabulary of 5"),
    ({"targets": torch.zeros(3, 4, dtype=torch.int64)}, r"targets of shape \(3, 4\), expected \(B, U\) = \(3, 3\)"),
    ({"tlen": torch.tensor([4, 2])}, r"logit_lengths of shape \(2,\), expected \(3,\)"),
    ({"targets": torch.tensor([[1, 2, 9], [1, 0, 0], [0, 0, 0]])}, r"targets\[0, 2\]=9 is not a label"),
    ({"targets": torch.tensor([[1, 0, 3], [1, 0, 0], [0, 0, 0]])}, r"targets\[0, 1\]=0 is not a label"),
    ({"logits": torch.zeros(3, 4, 4)}, r"logits of shape \(3, 4, 4\)"),
    ({"reduction": "avg"}, r"reduction='avg'"),
    ({"tlen": torch.tensor([4.0, 2.0, 3.0])}, r"logit_lengths of dtype torch.float32"),
])
def test_bad_inputs_are_refused_naming_the_value(change, named):
    logits, targets, tlen, ulen = batch()
    a = {"logits": logits, "targets": targets, "tlen": tlen, "ulen": ulen, "blank": 0, "reduction": "none", **change}
    for loss in (rnnt_loss, rnnt_loss_reference):
        with pytest.raises(RNNTInputError, match=named) as e:
            loss(a["logits"], a["targets"], a["tlen"], a["ulen"], blank=a["blank"], reduction=a["reduction"])
        assert isinstance(e.value, ValueError) and isinstance(e.value, SpeechperfError)


def test_joint_bytes_counts_the_joint_its_gradient_and_a_half_joints_copy():
    cells = 30 * 400 * 101
    assert joint_bytes(30, 400, 101, 500, torch.float32) == cells * 500 * 8 + cells * 44
    assert joint_bytes(30, 400, 101, 500, torch.bfloat16) == cells * 500 * (2 + 2 + 4) + cells * 44
    assert joint_bytes(30, 400, 101, 500) / 1e9 == pytest.approx(4.90, abs=0.01)  # GB


def test_the_cuda_kernels_compile_for_a_gpu():
    """numba.cuda types and compiles the three kernels to PTX for sm_90 (no GPU needed, but NVVM: the
    simulator runs them as Python and would not see a typing error the real compiler makes)."""
    from numba import cuda, types

    f32, f64, i64 = types.float32, types.float64, types.int64
    acts, lat, hold = types.Array(f32, 4, "C"), types.Array(f64, 3, "C"), types.Array(f32, 3, "C")
    tgt, lens, ll = types.Array(i64, 2, "C"), types.Array(i64, 1, "C"), types.Array(f64, 1, "C")
    sigs = {rnnt_cuda.rows_kernel: (acts, tgt, lens, lens, i64, types.boolean, acts, lat, lat, lat, hold),
            rnnt_cuda.alpha_beta_kernel: (lat, lat, lens, lens, lat, lat, ll),
            rnnt_cuda.grads_kernel: (tgt, lens, lens, i64, types.boolean, lat, lat, lat, lat, lat, ll, hold, acts)}
    for kernel, sig in sigs.items():
        try:
            ptx, _ = cuda.compile_ptx(kernel, sig, cc=(9, 0))
        except Exception as e:  # noqa: BLE001 - numba's errors for a missing NVVM vary by version
            if "nvvm" in str(e).lower() or "nvrtc" in str(e).lower() or "cuda" in type(e).__module__.lower():
                pytest.skip(f"no NVVM to compile with here: {type(e).__name__}")
            raise
        assert ".entry" in ptx and ".local" not in ptx, kernel.__name__  # no spilled per-thread arrays


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cuda_kernels_equal_the_cpu_kernel_on_a_gpu(dtype):
    logits, targets, tlen, ulen = batch(B=4, T=40, U=12, V=300, seed=6, tlen=(40, 17, 0, 33), ulen=(12, 3, 5, 0))
    targets = targets.clamp(min=0)
    logits = logits.to(dtype)
    want, want_grad = rnnt_cpu.forward(logits, targets, tlen, ulen, 0, True)
    for lengths_on in ("cpu", "cuda"):
        got, got_grad = rnnt_cuda.forward(logits.cuda(), targets.to(lengths_on), tlen.to(lengths_on),
                                          ulen.to(lengths_on), 0, True)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-4)
        tol = {"atol": 1e-5, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 1e-2, "rtol": 1e-2}
        torch.testing.assert_close(got_grad.cpu().float(), want_grad.float(), **tol)
    x = logits.cuda().requires_grad_()
    rnnt_loss(x, targets, tlen, ulen, reduction="sum").backward()
    assert x.grad.dtype == dtype and torch.isfinite(x.grad).all()


def test_the_cpu_kernel_runs_on_a_fork_safe_threading_layer():
    """numba's GNU OpenMP layer kills a forked child that runs a parallel kernel after its parent did;
    the kernel picks the fork-safe layer unless the environment names one."""
    logits, targets, tlen, ulen = batch()
    rnnt_loss(logits, targets, tlen, ulen)
    assert numba.threading_layer() in ("workqueue", "tbb") or "NUMBA_THREADING_LAYER" in os.environ
