"""The CTC loss's CPU kernel (numba, ``parallel=True``, cached): ``train.system.ctc_kernel=numba``.

Why not torch's: ``F.ctc_loss`` on a CPU runs its forward and backward variables in log space,
an ``exp`` and a ``log`` per lattice node in scalar code; in the `cpu` preset's step on a 2-core
AMD EPYC it took 16 ms of a 146 ms bf16 step (11%) and 146 ms of a 1.3 s evaluation pass
(``benchmarks/run.py step_profile``), and ``benchmarks/run.py ctc`` times it against this kernel.

How: Graves' recursions in probability space, each frame's variables rescaled to sum to 1
(Rabiner's scaling: the log-likelihood is the sum of the logs of the scales), in float64. A
lattice node is then two or three multiply-adds, and the exponentials are one per (frame,
class), not one per node. Per utterance (``prange`` over the batch, so any thread count gives
the same bytes):

1. ``p[t, s] = exp(lp[t, ext(s)])`` where ``ext`` is the label sequence with blanks around and
   between its symbols (S = 2L + 1 states), from one ``exp`` per class and frame.
2. alpha (forward) and, when a gradient is wanted, beta (backward, excluding frame t's own
   emission), each frame scaled; a frame whose variables are all 0 means no alignment fits
   (too few frames): the loss is inf, as torch's.
3. The gradient of the loss with respect to the log-probabilities, ``-sum over s with
   ext(s)=k of gamma_t(s)``, the state posteriors ``alpha * beta / sum(alpha * beta)`` (the
   scales cancel); torch returns ``exp(lp) - gamma`` (the gradient of the logits, taking the
   log-probabilities to come from a log-softmax), which a log-softmax's backward leaves as it is.

Accuracy: float64 throughout, so against torch's float64 loss on random logits the gradient of
the logits differs by ~3e-7 where torch's own float32 kernel differs by ~2e-4
(tests/objectives/test_ctc_cpu.py). Probabilities under float64's range (e^-745) flush to 0: where
that leaves an utterance no path, it is computed again in log space (``_log_space``), so a model
that puts its labels hundreds of nats under the blank still gets its finite loss and gradient.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit, prange

from speechperf.decode.kernel import log_add  # -inf-safe, the beam searches' and the RNN-T kernel's
from speechperf.objectives.rnnt_cpu import _ONE_AT_A_TIME, GRAIN, fork_safe_threads, threads

# lattice nodes a thread should get at least: on the 2-core EPYC the `cpu` preset's batch (526k nodes)
# took 3.1 ms on one numba thread and 3.6 ms on two (forward + backward, bench ctc): a parallel region
# pays only for larger batches
NODES_PER_THREAD = 1 << 20


@njit(cache=True)
def _states(labels, start, L, blank):
    """(ext, skip): the S = 2L + 1 states' symbols, and 1.0 where state s may be entered from
    s - 2 (a label unlike the one before it), else 0.0 (a multiplier: the recursions stay branch-free)."""
    S = 2 * L + 1
    ext = np.full(S, blank, np.int64)
    skip = np.zeros(S)
    for i in range(L):
        ext[2 * i + 1] = labels[start + i]
        if i > 0 and labels[start + i] != labels[start + i - 1]:
            skip[2 * i + 1] = 1.0
    return ext, skip


@njit(cache=True)
def _emissions(lp, b, Tb, ext, C):
    """(Tb, S) float64: each state's emission probability per frame, one exp per (frame, class)."""
    S = ext.size
    e = np.empty(C)
    p = np.empty((Tb, S))
    for t in range(Tb):
        for k in range(C):
            e[k] = math.exp(lp[t, b, k])
        for s in range(S):
            p[t, s] = e[ext[s]]
    return p


@njit(cache=True)
def _alpha(p, skip):
    """(alpha (Tb, S + 2), its first two columns 0 so that s - 1 and s - 2 need no test, each frame
    scaled to sum 1; the log-likelihood: -inf where no path fits, NaN from a NaN input)."""
    Tb, S = p.shape
    alpha = np.zeros((Tb, S + 2))  # state s at column s + 2
    logc = 0.0
    for t in range(Tb):
        if t == 0:
            alpha[0, 2: min(S, 2) + 2] = p[0, :2]
        else:
            for s in range(S):
                alpha[t, s + 2] = (alpha[t - 1, s + 2] + alpha[t - 1, s + 1] + skip[s] * alpha[t - 1, s]) * p[t, s]
        c = 0.0
        for s in range(2, S + 2):
            c += alpha[t, s]
        if not c > 0.0:  # 0: no path reaches frame t; NaN: a NaN input, kept
            return alpha, -np.inf if c == 0.0 else c
        inv = 1.0 / c
        for s in range(2, S + 2):
            alpha[t, s] *= inv
        logc += math.log(c)
    end = alpha[Tb - 1, S + 1] + alpha[Tb - 1, S]  # the last label or the blank after it (S = 1: column 2 is 0)
    return alpha, (logc + math.log(end)) if end > 0.0 else -np.inf


@njit(cache=True)
def _beta(p, skip):
    """(Tb, S): the probability of finishing from state s after frame t (frame t's emission
    excluded), each frame scaled to sum 1."""
    Tb, S = p.shape
    beta = np.zeros((Tb, S))
    beta[Tb - 1, S - 1] = 1.0
    if S > 1:
        beta[Tb - 1, S - 2] = 1.0
    q = np.zeros(S + 2)  # beta x emission of frame t + 1, two 0s after it so that s + 1 and s + 2 need no test
    ahead = np.zeros(S)  # skip[s + 2]: whether state s + 2 may be entered from s
    ahead[: S - 2] = skip[2:]
    for t in range(Tb - 2, -1, -1):
        for s in range(S):
            q[s] = beta[t + 1, s] * p[t + 1, s]
        d = 0.0
        for s in range(S):
            beta[t, s] = q[s] + q[s + 1] + ahead[s] * q[s + 2]
            d += beta[t, s]
        inv = 1.0 / d
        for s in range(S):
            beta[t, s] *= inv
    return beta


@njit(cache=True)
def _gradient(alpha, beta, ext, b, grad):
    """grad[t, b, k] = -(the posterior of the states of symbol k at frame t), summed in float64."""
    Tb, S = beta.shape
    post = np.empty(S)
    acc = np.empty(grad.shape[2])
    for t in range(Tb):
        z = 0.0
        for s in range(S):
            post[s] = alpha[t, s + 2] * beta[t, s]
            z += post[s]
        inv = 1.0 / z
        acc[:] = 0.0
        blank = 0.0  # the even states, all the blank: summed in a register, not through acc
        for s in range(0, S, 2):
            blank += post[s]
        for s in range(1, S, 2):
            acc[ext[s]] += post[s] * inv
        acc[ext[0]] += blank * inv
        for k in range(acc.size):
            grad[t, b, k] = -acc[k]


@njit(cache=True)
def _log_space(lp, b, Tb, ext, skip, want_grad, grad):
    """The same loss and gradient in log space, a log-add per node: where the scaled recursion found no
    path (an alignment too long for its frames, -inf here too, or emissions below float64's range,
    e^-745 under the frame's best: finite here). Returns the log-likelihood."""
    S = ext.size
    la = np.full((Tb, S + 2), -np.inf)  # state s at column s + 2, as in _alpha
    la[0, 2: min(S, 2) + 2] = lp[0, b, ext[:2]]
    for t in range(1, Tb):
        for s in range(S):
            a = log_add(la[t - 1, s + 2], la[t - 1, s + 1])
            if skip[s] > 0.0:
                a = log_add(a, la[t - 1, s])
            la[t, s + 2] = a + lp[t, b, ext[s]]
    ll = log_add(la[Tb - 1, S + 1], la[Tb - 1, S])
    if not (want_grad and math.isfinite(ll)):
        return ll
    lb = np.full((Tb, S + 2), -np.inf)  # finishing from s after frame t, two -inf columns after S
    lb[Tb - 1, S - 1] = 0.0
    lb[Tb - 1, max(S - 2, 0)] = 0.0
    for t in range(Tb - 2, -1, -1):
        for s in range(S):
            q = lb[t + 1, s] + lp[t + 1, b, ext[s]]
            if s + 1 < S:
                q = log_add(q, lb[t + 1, s + 1] + lp[t + 1, b, ext[s + 1]])
            if s + 2 < S and skip[s + 2] > 0.0:
                q = log_add(q, lb[t + 1, s + 2] + lp[t + 1, b, ext[s + 2]])
            lb[t, s] = q
    for t in range(Tb):
        for s in range(S):
            grad[t, b, ext[s]] -= math.exp(la[t, s + 2] + lb[t, s] - ll)
    return ll


@njit(parallel=True, cache=True)
def _ctc(lp, labels, starts, tlen, llen, blank, want_grad, grad, loss):
    """loss[b] = -log p(labels_b | lp[:tlen[b], b]) (inf: no alignment fits); with ``want_grad``,
    grad (T, B, C) = its gradient with respect to ``lp`` (0 past each utterance's frames)."""
    T, B, C = lp.shape
    for b in prange(B):
        if want_grad:
            grad[:, b, :] = 0
        Tb = tlen[b]
        if Tb == 0:
            loss[b] = np.inf
            continue
        ext, skip = _states(labels, starts[b], llen[b], blank)
        p = _emissions(lp, b, Tb, ext, C)
        alpha, ll = _alpha(p, skip)
        if ll == -np.inf:  # no path in range: too few frames, or emissions under float64's (log space)
            loss[b] = -_log_space(lp, b, Tb, ext, skip, want_grad, grad)
            continue
        loss[b] = -ll
        if want_grad and math.isfinite(ll):
            _gradient(alpha, _beta(p, skip), ext, b, grad)


def _flat(labels: torch.Tensor, label_lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the labels as one int64 array, each utterance's start in it): F.ctc_loss's two layouts,
    concatenated (1-D) or padded (B, L_max)."""
    lab = labels.detach().to(torch.int64).cpu().numpy()
    if lab.ndim == 2:
        return lab.reshape(-1), np.arange(lab.shape[0], dtype=np.int64) * lab.shape[1]
    return lab, np.concatenate([[0], np.cumsum(label_lens)[:-1]]).astype(np.int64)


def used_positions(starts: np.ndarray, llen: np.ndarray) -> np.ndarray:
    """The positions of the labels the lengths select: ``starts[b] + 0..llen[b] - 1`` for each b, in order."""
    firsts = np.repeat(starts - np.cumsum(llen) + llen, llen)  # each label's start, less its rank in the batch
    return firsts + np.arange(int(llen.sum()))


def check(lp: torch.Tensor, labels: np.ndarray, starts: np.ndarray, tlen: np.ndarray, llen: np.ndarray,
          blank: int) -> None:
    """What F.ctc_loss refuses, refused by name (ValueError) before the kernel reads out of bounds."""
    T, B, C = lp.shape
    if len(tlen) != B or len(llen) != B:
        raise ValueError(f"ctc: {len(tlen)} input and {len(llen)} label lengths for a batch of {B}")
    if len(tlen) and (tlen.min() < 0 or tlen.max() > T):
        raise ValueError(f"ctc: input lengths {tlen.min()}..{tlen.max()} outside 0..{T} (the frames given)")
    if len(llen) and (llen.min() < 0 or (starts + llen).max() > labels.size):
        raise ValueError(f"ctc: label lengths (sum {llen.sum()}) beyond the {labels.size} labels given")
    used = labels[used_positions(starts, llen)]  # a padded layout's padding is never read: any value
    if used.size and (used.min() < 0 or used.max() >= C):
        raise ValueError(f"ctc: labels {used.min()}..{used.max()} outside the {C} classes")
    if not 0 <= blank < C:
        raise ValueError(f"ctc: blank {blank} outside the {C} classes")


def losses_and_grad(lp: torch.Tensor, labels: torch.Tensor, out_lens, label_lens, blank: int = 0,
                    want_grad: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """((B,) -log-likelihoods in ``lp``'s dtype, inf where impossible; the gradient (T, B, C) or None)
    of CPU log-probabilities ``lp`` (T, B, C) float32 or float64. One call at a time in a process."""
    work = lp.detach().contiguous()
    tlen = torch.as_tensor(out_lens).to(torch.int64).numpy()
    llen = torch.as_tensor(label_lens).to(torch.int64).numpy()
    flat, starts = _flat(labels, llen)
    check(work, flat, starts, tlen, llen, blank)
    grad = torch.empty_like(work) if want_grad else torch.empty((1, 1, 1), dtype=work.dtype)
    loss = np.empty(work.shape[1], np.float64)
    fork_safe_threads()
    with _ONE_AT_A_TIME, threads(GRAIN * int(np.dot(tlen, 2 * llen + 1)) // NODES_PER_THREAD):
        _ctc(work.numpy(), flat, starts, tlen, llen, int(blank), want_grad, grad.numpy(), loss)
    return torch.from_numpy(loss).to(lp.dtype), (grad if want_grad else None)


class NumbaCTCLoss(torch.autograd.Function):
    """Per-utterance losses whose backward scales the gradient computed with them."""

    @staticmethod
    def forward(ctx, lp, labels, out_lens, label_lens, blank, zero_infinity):
        losses, grad = losses_and_grad(lp, labels, out_lens, label_lens, blank, want_grad=lp.requires_grad)
        if zero_infinity:
            losses = torch.where(torch.isinf(losses), torch.zeros_like(losses), losses)  # their gradient is 0 already
        ctx.save_for_backward(grad if grad is not None else torch.empty(0))
        return losses

    @staticmethod
    def backward(ctx, grad_losses):
        grad, = ctx.saved_tensors
        return grad * grad_losses.to(grad.dtype).view(1, -1, 1), None, None, None, None, None  # (T, B, C)


def ctc_loss(log_probs: torch.Tensor, labels: torch.Tensor, out_lens, label_lens, blank: int = 0,
             zero_infinity: bool = False) -> torch.Tensor:
    """F.ctc_loss(..., reduction="none") on CPU log-probabilities (T, B, C), by this kernel: (B,)."""
    return NumbaCTCLoss.apply(log_probs, labels, out_lens, label_lens, blank, zero_infinity)


def warm() -> None:
    """Compile (or load from numba's cache) the kernel before a run's clock: a 2-utterance batch."""
    lp = torch.full((4, 2, 3), -math.log(3.0), requires_grad=True)
    ctc_loss(lp, torch.tensor([1, 2, 1]), torch.tensor([4, 3]), torch.tensor([2, 1])).sum().backward()
