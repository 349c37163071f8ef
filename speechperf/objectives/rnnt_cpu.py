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

The passes are split so that each parallel loop is even: rows and gradients are O(V) per node
and spread over B*T iterations (the batch alone would leave cores idle at B < cores or with
unequal lengths); the recursion is O(1) per node and sequential inside an utterance. Memory: the
gradient buffer (the logits' size: for float32 logits a new one, for half-precision logits their
float32 working copy, overwritten in place) and five (B, T, U+1) lattice arrays.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit, prange

NEG_INF = -np.inf


@njit(cache=True, nogil=True)
def _lse(a, b):
    """log(exp(a) + exp(b)), -inf-safe."""
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    if a > b:
        return a + math.log1p(math.exp(b - a))
    return b + math.log1p(math.exp(a - b))


@njit(parallel=True, cache=True)
def _rows(acts, targets, tlen, ulen, blank, fused, grads, lpb, lpy, logs):
    """Per node: ``logs`` = log sum exp(x - max), ``lpb``/``lpy`` = blank's / the next label's log-probability;
    ``grads`` = exp(x - max) (fused) or 0 (x already log-probabilities), 0 outside the lattice.
    ``acts`` and ``grads`` may be one array: each logit is read before its place is written."""
    B, T, U1, V = acts.shape
    for i in prange(B * T):
        b = i // T
        t = i - b * T
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
                s = 0.0
                for v in range(V):
                    e = math.exp(acts[b, t, u, v] - m)
                    grads[b, t, u, v] = e
                    s += e
                logs[b, t, u] = math.log(s)
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
                    a = _lse(a, alpha[b, t, u - 1] + lpy[b, t, u - 1])
                alpha[b, t, u] = a
        for t in range(Tb - 1, -1, -1):
            for u in range(Ub, -1, -1):
                c = lpb[b, t, u] if t == Tb - 1 and u == Ub else NEG_INF
                if t < Tb - 1:
                    c = beta[b, t + 1, u] + lpb[b, t, u]
                if u < Ub:
                    c = _lse(c, beta[b, t, u + 1] + lpy[b, t, u])
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


def run(acts: np.ndarray, grads: np.ndarray, targets: np.ndarray, tlen: np.ndarray, ulen: np.ndarray,
        blank: int, fused: bool, dtype=np.float64) -> np.ndarray:
    """The three passes on numpy arrays: the log-likelihood (B,) in float64; ``grads`` filled (it may
    be ``acts`` itself)."""
    B, T, U1, _ = acts.shape
    w = lattice(B, T, U1, dtype)
    ll = np.empty(B, np.float64)
    _rows(acts, targets, tlen, ulen, blank, fused, grads, w["lpb"], w["lpy"], w["logs"])
    _alpha_beta(w["lpb"], w["lpy"], tlen, ulen, w["alpha"], w["beta"], ll)
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
