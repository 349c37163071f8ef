"""The RNN-T loss's CPU kernel (numba, ``parallel=True``, cached): three passes over the lattice.

1. ``_rows``, parallel over the batch's (utterance, frame) pairs: per (t, u) the log-softmax's
   normaliser over V (max, then the sum of exp in float64) and the log-probabilities of blank
   and of the next label; with the fused log-softmax it writes exp(x - max) into the gradient
   buffer on the way, so the softmax's one exp per logit is not computed twice.
2. ``_alpha_beta``, parallel over utterances: the forward and backward variables (float64) over
   the utterance's own T_b x (U_b + 1) lattice, and the log-likelihood.
3. ``_grads``, parallel over (utterance, frame): the gradient in place in the buffer: the stored
   exp(x - max) scaled by the node's posterior over the normaliser, less the posteriors of the
   blank and label transitions leaving the node (warp-transducer's formula).

Speed: float32 logits take the exponential as a polynomial that numba vectorizes (``exp_row``:
libm's expf is one call per logit, 10x slower), so pass 1 costs about as much as torch's own
log-softmax; pass 3 is a multiply per logit. Threads: torch's thread count (a run's ``threads``),
fewer where a pass is small (``threads``: one thread runs no parallel region, whose start cost
20 ms a pass on a loaded 2-core machine).

The passes are split so that each parallel loop is even: rows and gradients are O(V) per node
and spread over B*T iterations (the batch alone would leave cores idle at B < cores or with
unequal lengths); the recursion is O(1) per node and sequential inside an utterance. Memory: the
gradient buffer (the logits' size: for float32 logits a new one, for half-precision logits their
float32 working copy, overwritten in place) and five (B, T, U+1) lattice arrays.
"""
from __future__ import annotations

import math
import os
import threading
from contextlib import contextmanager

import numba
import numpy as np
import torch
from numba import njit, prange, types
from numba.extending import overload

from speechperf.decode.kernel import log_add  # the beam searches' -inf-safe log-add, one numba function for both

NEG_INF = -np.inf
# expf by Cody-Waite reduction and a degree-7 polynomial (Cephes' coefficients): 2^k e^r, k = round(x / ln 2)
LOG2E, LN2_HI, LN2_LO = np.float32(1.4426950408889634), np.float32(0.693359375), np.float32(-2.12194440e-4)
EXP_POLY = tuple(np.float32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                                         1.6666665459e-1, 5.0000001201e-1))
GRAIN = 1 << 16  # logits a thread should get at least (~50 us of a pass)
LATTICE_COST = 16  # a lattice node's recursion (two log-add-exps) against a logit's pass, in GRAIN's units
EXP_FLOOR = np.float32(-87.33)  # below it e^x is under float32's least normal number: written as 0


def exp_row(x, m, out, k):
    """out[v] = exp(x[v] - m) over a row; returns their sum (float64). Compiled only (the overload below)."""
    raise NotImplementedError("exp_row runs inside the numba kernels")


def _exp_row_f32(x, m, out, k):
    """float32: a polynomial numba vectorizes (libm's expf is a call per element, 10x slower here, measured on
    3.2M logits: 24 ms against 2.3 ms on one core), within 1 ulp (6e-8 relative). ``k`` is int32 scratch."""
    for v in range(x.size):
        d = max(x[v] - m, EXP_FLOOR)
        n = math.floor(d * LOG2E + np.float32(0.5))
        r = d - n * LN2_HI - n * LN2_LO
        p = EXP_POLY[0]
        for c in EXP_POLY[1:]:
            p = p * r + c
        out[v] = p * r * r + r + np.float32(1.0)
        k[v] = np.int32(n) if x[v] - m > EXP_FLOOR else np.int32(-255)  # -255: an exponent of 0 below, out = 0
    bits = out.view(np.int32)
    s = 0.0
    nan = 0
    for v in range(x.size):
        bits[v] = bits[v] + (k[v] << 23) if k[v] > -255 else 0
        s += out[v]
        nan += x[v] != x[v]
    return s if nan == 0 else np.nan


def _exp_row_any(x, m, out, k):
    s = 0.0
    for v in range(x.size):
        out[v] = math.exp(x[v] - m)
        s += out[v]
    return s


@overload(exp_row, jit_options={"fastmath": {"reassoc", "contract"}})
def _exp_row_typed(x, m, out, k):
    return _exp_row_f32 if x.dtype == types.float32 else _exp_row_any


@njit(parallel=True, cache=True, fastmath={"reassoc", "contract"})
def _rows(acts, targets, tlen, ulen, blank, fused, grads, lpb, lpy, logs):
    """Per node: ``logs`` = log sum exp(x - max), ``lpb``/``lpy`` = blank's / the next label's log-probability;
    ``grads`` = exp(x - max) (fused) or 0 (x already log-probabilities), 0 outside the lattice.
    ``acts`` and ``grads`` may be one array: each logit is read before its place is written."""
    B, T, U1, V = acts.shape
    for i in prange(B * T):
        b = i // T
        t = i - b * T
        scratch = np.empty(V, np.int32)
        for u in range(U1):
            if t >= tlen[b] or u > ulen[b]:
                grads[b, t, u, :] = 0
                continue
            xb = acts[b, t, u, blank]
            xy = acts[b, t, u, targets[b, u]] if u < ulen[b] else xb
            d = 0.0
            if fused:
                m = acts[b, t, u, 0]
                for v in range(1, V):
                    m = max(m, acts[b, t, u, v])
                logs[b, t, u] = math.log(exp_row(acts[b, t, u], m, grads[b, t, u], scratch))
                d = m + logs[b, t, u]
            else:
                grads[b, t, u, :] = 0
            lpb[b, t, u] = xb - d
            lpy[b, t, u] = xy - d


@njit(parallel=True, cache=True)
def _alpha_beta(lpb, lpy, tlen, ulen, alpha, beta, ll):
    """alpha[t, u] = log P(reach (t, u)), beta[t, u] = log P(finish from (t, u)); ll = log P(targets),
    -inf where T_b = 0 (no path)."""
    for b in prange(lpb.shape[0]):
        Tb, Ub = tlen[b], ulen[b]
        if Tb == 0:
            ll[b] = NEG_INF
            continue
        for t in range(Tb):
            for u in range(Ub + 1):
                a = 0.0 if t == 0 and u == 0 else NEG_INF
                if t > 0:
                    a = alpha[b, t - 1, u] + lpb[b, t - 1, u]
                if u > 0:
                    a = log_add(a, alpha[b, t, u - 1] + lpy[b, t, u - 1])
                alpha[b, t, u] = a
        for t in range(Tb - 1, -1, -1):
            for u in range(Ub, -1, -1):
                c = lpb[b, t, u] if t == Tb - 1 and u == Ub else NEG_INF
                if t < Tb - 1:
                    c = beta[b, t + 1, u] + lpb[b, t, u]
                if u < Ub:
                    c = log_add(c, beta[b, t, u + 1] + lpy[b, t, u])
                beta[b, t, u] = c
        ll[b] = alpha[b, Tb - 1, Ub] + lpb[b, Tb - 1, Ub]


@njit(parallel=True, cache=True)
def _grads(targets, tlen, ulen, blank, fused, alpha, beta, lpb, lpy, logs, ll, scale, grads):
    """d(-ll)/d x at every node, in place over ``_rows``' buffer. ``scale`` (the buffer's dtype) holds each
    node's softmax factor, so that the per-logit multiply runs in the buffer's precision."""
    B, T, U1, V = grads.shape
    for i in prange(B * T):
        b = i // T
        t = i - b * T
        Tb, Ub = tlen[b], ulen[b]
        if t >= Tb:
            continue
        for u in range(Ub + 1):
            base = alpha[b, t, u] - ll[b]
            if fused:
                scale[b, t, u] = math.exp(base + beta[b, t, u] - logs[b, t, u])
                f = scale[b, t, u]
                for v in range(V):
                    grads[b, t, u, v] *= f
            nb = NEG_INF
            if t < Tb - 1:
                nb = base + lpb[b, t, u] + beta[b, t + 1, u]
            elif u == Ub:
                nb = base + lpb[b, t, u]  # the final blank
            grads[b, t, u, blank] -= math.exp(nb)
            if u < Ub:
                grads[b, t, u, targets[b, u]] -= math.exp(base + lpy[b, t, u] + beta[b, t, u + 1])


def lattice(B: int, T: int, U1: int, dtype=np.float64) -> dict:
    """The kernels' (B, T, U+1) work arrays: ``dtype`` float64 (the loss's) or float32 (the accuracy
    measurement's)."""
    return {k: np.full((B, T, U1), NEG_INF, dtype) for k in ("lpb", "lpy", "logs", "alpha", "beta")}


@contextmanager
def threads(work: int):
    """numba's threads for a pass of ``work`` logits' worth: torch's thread count (a run's ``threads``
    setting), fewer where each would get under GRAIN; one thread runs no parallel region at all, whose
    start (waking the other threads) cost 20 ms a pass on a loaded 2-core machine (measured)."""
    before = numba.get_num_threads()
    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS, work // GRAIN)))
    try:
        yield
    finally:
        numba.set_num_threads(before)


_ONE_AT_A_TIME = threading.Lock()  # numba's fork-safe workqueue layer is not thread-safe


def fork_safe_threads() -> None:
    """numba's threads from its fork-safe layer (``forksafe``: tbb where installed, else its workqueue)
    unless NUMBA_THREADING_LAYER names one or a parallel kernel already ran. numba's default here is
    GNU OpenMP, which kills a process forked after a parallel kernel when the child runs one
    ("Terminating: fork() called from a process already using GNU OpenMP"; measured), and this
    project forks processes from processes (the loader's readers, the tests' forked commands)."""
    if "NUMBA_THREADING_LAYER" in os.environ:
        return
    try:
        numba.threading_layer()  # raises before the first parallel launch
    except ValueError:
        numba.config.THREADING_LAYER = "forksafe"


def run(acts: np.ndarray, grads: np.ndarray, targets: np.ndarray, tlen: np.ndarray, ulen: np.ndarray,
        blank: int, fused: bool, dtype=np.float64) -> np.ndarray:
    """The three passes on numpy arrays: the log-likelihood (B,) in float64; ``grads`` filled (it may
    be ``acts`` itself). One call at a time in a process (the lock)."""
    fork_safe_threads()
    with _ONE_AT_A_TIME:
        return _passes(acts, grads, targets, tlen, ulen, blank, fused, dtype)


def _passes(acts, grads, targets, tlen, ulen, blank: int, fused: bool, dtype) -> np.ndarray:
    B, T, U1, _ = acts.shape
    w = lattice(B, T, U1, dtype)
    ll = np.empty(B, np.float64)
    with threads(acts.size):
        _rows(acts, targets, tlen, ulen, blank, fused, grads, w["lpb"], w["lpy"], w["logs"])
    with threads(min(B * GRAIN, B * T * U1 * LATTICE_COST)):  # one utterance a thread at most
        _alpha_beta(w["lpb"], w["lpy"], tlen, ulen, w["alpha"], w["beta"], ll)
    with threads(acts.size):
        _grads(targets, tlen, ulen, blank, fused, w["alpha"], w["beta"], w["lpb"], w["lpy"], w["logs"], ll,
               np.empty((B, T, U1), grads.dtype), grads)
    return ll


def forward(logits: torch.Tensor, targets, logit_lengths, target_lengths, blank: int, fused: bool):
    """(costs (B,) float32 (float64 for float64 logits), gradient in the logits' dtype) for CPU tensors."""
    half = logits.dtype in (torch.bfloat16, torch.float16)
    work = logits.float().contiguous() if half else logits.contiguous()  # (B, T, U+1, V), the kernel's dtype
    grads = work if half else torch.empty_like(work)  # a half joint's float32 copy becomes the gradient
    tgt = targets.to(torch.int64).contiguous().numpy()  # (B, U)
    tlen = logit_lengths.to(torch.int64).numpy()
    ulen = target_lengths.to(torch.int64).numpy()
    ll = run(work.numpy(), grads.numpy(), tgt, tlen, ulen, int(blank), bool(fused))
    costs = torch.from_numpy(-ll).to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
    return costs, grads.to(logits.dtype)
