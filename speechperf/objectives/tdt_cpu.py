"""The TDT loss's CPU kernel (numba, ``parallel=True``, cached): the RNN-T kernel's three passes
(rnnt_cpu.py) with a duration per arc.

1. ``_rows``, parallel over (utterance, frame): per node (t, u) the token log-softmax's normaliser
   over the first V logits (``rnnt_cpu.exp_row``: exp(x - max) written into the gradient buffer on
   the way), blank's and the next label's log-probabilities less ``sigma``, and the duration
   log-softmax over the last D logits (its softmax written into the buffer).
2. ``_alpha_beta``, parallel over utterances: alpha and beta (float64) over the T_b x (U_b + 1)
   lattice, every arc (blank with d >= 1, label with any d) carrying its duration's log-probability;
   the log-likelihood (the final blank lands exactly on T_b).
3. ``_grads``, parallel over (utterance, frame): token logits as RNN-T's (the node's occupancy times
   the softmax less the posteriors of its blank and label arcs), duration logits the occupancy times
   the duration softmax less the posterior of the arcs of each duration. An utterance with no path
   (ll = -inf) gets a zero gradient.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from speechperf.decode.kernel import log_add
from speechperf.objectives import rnnt_cpu
from speechperf.objectives.rnnt_cpu import GRAIN, LATTICE_COST, exp_row

NEG_INF = -np.inf


@njit(parallel=True, cache=True, fastmath={"reassoc", "contract"})
def _rows(acts, V, targets, tlen, ulen, blank, fused, sigma, grads, lpb, lpy, lpd, logs):
    """Per node: ``logs``, ``lpb``/``lpy`` (token log-probabilities less sigma), ``lpd`` (B, T, U+1, D)
    the durations' log-probabilities; ``grads`` = the two softmaxes' numerators (fused) or 0."""
    B, T, U1, W = acts.shape
    D = W - V
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
            xd = acts[b, t, u, V:].copy()  # (D,): read before the buffer (maybe ``acts`` itself) is written
            tok = 0.0
            dur = 0.0
            if fused:
                m = acts[b, t, u, 0]
                for v in range(1, V):
                    m = max(m, acts[b, t, u, v])
                logs[b, t, u] = math.log(exp_row(acts[b, t, u, :V], m, grads[b, t, u, :V], scratch))
                tok = m + logs[b, t, u]
                md = xd[0]
                for k in range(1, D):
                    md = max(md, xd[k])
                s = 0.0
                for k in range(D):
                    s += math.exp(xd[k] - md)
                dur = md + math.log(s)
                for k in range(D):
                    grads[b, t, u, V + k] = math.exp(xd[k] - dur)
            else:
                grads[b, t, u, :] = 0
            lpb[b, t, u] = xb - tok - sigma
            lpy[b, t, u] = xy - tok - sigma
            for k in range(D):
                lpd[b, t, u, k] = xd[k] - dur


@njit(cache=True)
def _alpha(b, durs, lpb, lpy, lpd, Tb, Ub, alpha):
    """alpha[t, u] = log P(reach (t, u)); returns log P(targets) (the final blank lands on T_b)."""
    for t in range(Tb):
        for u in range(Ub + 1):
            a = 0.0 if t == 0 and u == 0 else NEG_INF
            for k in range(durs.size):
                d = durs[k]
                s = t - d
                if s < 0:
                    continue
                if d > 0:
                    a = log_add(a, alpha[b, s, u] + lpb[b, s, u] + lpd[b, s, u, k])
                if u > 0:
                    a = log_add(a, alpha[b, s, u - 1] + lpy[b, s, u - 1] + lpd[b, s, u - 1, k])
            alpha[b, t, u] = a
    ll = NEG_INF
    for k in range(durs.size):
        s = Tb - durs[k]
        if durs[k] > 0 and s >= 0:
            ll = log_add(ll, alpha[b, s, Ub] + lpb[b, s, Ub] + lpd[b, s, Ub, k])
    return ll


@njit(cache=True)
def _beta(b, durs, lpb, lpy, lpd, Tb, Ub, beta):
    """beta[t, u] = log P(finish from (t, u))."""
    for t in range(Tb - 1, -1, -1):
        for u in range(Ub, -1, -1):
            c = NEG_INF
            for k in range(durs.size):
                d = durs[k]
                n = t + d
                if d > 0 and n < Tb:
                    c = log_add(c, beta[b, n, u] + lpb[b, t, u] + lpd[b, t, u, k])
                elif d > 0 and n == Tb and u == Ub:
                    c = log_add(c, lpb[b, t, u] + lpd[b, t, u, k])
                if u < Ub and n < Tb:
                    c = log_add(c, beta[b, n, u + 1] + lpy[b, t, u] + lpd[b, t, u, k])
            beta[b, t, u] = c


@njit(parallel=True, cache=True)
def _alpha_beta(durs, lpb, lpy, lpd, tlen, ulen, alpha, beta, ll):
    for b in prange(lpb.shape[0]):
        Tb, Ub = tlen[b], ulen[b]
        ll[b] = NEG_INF
        if Tb > 0:
            ll[b] = _alpha(b, durs, lpb, lpy, lpd, Tb, Ub, alpha)
            _beta(b, durs, lpb, lpy, lpd, Tb, Ub, beta)


@njit(cache=True)
def _arcs(b, t, u, V, durs, targets, blank, base, Tb, Ub, beta, lpb, lpy, lpd, grads):
    """Subtract each arc's posterior leaving (t, u) from its token's and its duration's gradient."""
    for k in range(durs.size):
        d = durs[k]
        n = t + d
        pb = 0.0
        py = 0.0
        if d > 0 and n < Tb:
            pb = math.exp(base + lpb[b, t, u] + lpd[b, t, u, k] + beta[b, n, u])
        elif d > 0 and n == Tb and u == Ub:
            pb = math.exp(base + lpb[b, t, u] + lpd[b, t, u, k])
        if u < Ub and n < Tb:
            py = math.exp(base + lpy[b, t, u] + lpd[b, t, u, k] + beta[b, n, u + 1])
            grads[b, t, u, targets[b, u]] -= py
        grads[b, t, u, blank] -= pb
        grads[b, t, u, V + k] -= pb + py


@njit(parallel=True, cache=True)
def _grads(V, durs, targets, tlen, ulen, blank, fused, alpha, beta, lpb, lpy, lpd, logs, ll, scale, grads):
    """d(-ll)/d x at every node, in place over ``_rows``' buffer; zero for an utterance with no path."""
    B, T, U1, W = grads.shape
    for i in prange(B * T):
        b = i // T
        t = i - b * T
        Tb, Ub = tlen[b], ulen[b]
        if t >= Tb:
            continue
        if ll[b] == NEG_INF:
            grads[b, t, :, :] = 0
            continue
        for u in range(Ub + 1):
            base = alpha[b, t, u] - ll[b]
            if fused:
                occupancy = math.exp(base + beta[b, t, u])
                scale[b, t, u] = math.exp(base + beta[b, t, u] - logs[b, t, u])
                f = scale[b, t, u]
                for v in range(V):
                    grads[b, t, u, v] *= f
                for k in range(W - V):
                    grads[b, t, u, V + k] *= occupancy
            _arcs(b, t, u, V, durs, targets, blank, base, Tb, Ub, beta, lpb, lpy, lpd, grads)


def run(acts: np.ndarray, grads: np.ndarray, targets: np.ndarray, tlen: np.ndarray, ulen: np.ndarray,
        durations: np.ndarray, blank: int, fused: bool, sigma: float = 0.0) -> np.ndarray:
    """The three passes on numpy arrays (``acts`` (B, T, U+1, V+D), the last D the durations' logits):
    the log-likelihood (B,) in float64; ``grads`` filled (it may be ``acts`` itself)."""
    rnnt_cpu.fork_safe_threads()
    with rnnt_cpu._ONE_AT_A_TIME:
        return _passes(acts, grads, targets, tlen, ulen, durations, blank, fused, sigma)


def _passes(acts, grads, targets, tlen, ulen, durations, blank: int, fused: bool, sigma: float) -> np.ndarray:
    B, T, U1, W = acts.shape
    D = len(durations)
    V = W - D
    w = rnnt_cpu.lattice(B, T, U1)
    lpd = np.full((B, T, U1, D), NEG_INF)
    ll = np.empty(B, np.float64)
    durs = np.asarray(durations, np.int64)
    with rnnt_cpu.threads(acts.size):
        _rows(acts, V, targets, tlen, ulen, blank, fused, float(sigma), grads, w["lpb"], w["lpy"], lpd, w["logs"])
    with rnnt_cpu.threads(min(B * GRAIN, B * T * U1 * D * LATTICE_COST)):
        _alpha_beta(durs, w["lpb"], w["lpy"], lpd, tlen, ulen, w["alpha"], w["beta"], ll)
    with rnnt_cpu.threads(acts.size):
        _grads(V, durs, targets, tlen, ulen, blank, fused, w["alpha"], w["beta"], w["lpb"], w["lpy"], lpd,
               w["logs"], ll, np.empty((B, T, U1), grads.dtype), grads)
    return ll
