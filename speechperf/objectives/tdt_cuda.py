"""The TDT loss's CUDA kernels (numba.cuda): the CPU kernel's three passes (tdt_cpu.py) on a GPU, in
rnnt_cuda.py's style (its docstring says why numba.cuda, and how streams, lengths and half precision
are handled: the same here).

1. ``rows_kernel``: one block per node (b, t, u), its threads striding over the V token logits (max
   and sum of exp reduced in shared memory, float64 sums, exp(x - max) written into the gradient
   buffer); thread 0 then takes the D duration logits' log-softmax (D is a handful) and writes their
   softmax into the buffer's last D places, blank's and the label's log-probabilities less sigma.
2. ``alpha_beta_kernel``: grid (B, 2), an utterance's alphas in one block and its betas in another,
   threads over u, one anti-diagonal t + u per step: every TDT arc, (t, u) -> (t + d, u) with d >= 1
   or (t + d, u + 1) with d >= 0, ends on a later diagonal, so RNN-T's diagonal order holds.
3. ``grads_kernel``: one block per node: the token logits scaled by the node's posterior over the
   normaliser, the duration logits by its occupancy, less each leaving arc's posterior (thread 0).
"""
from __future__ import annotations

import functools
import math

import numba
import numpy as np
import torch
from numba import cuda

from speechperf.objectives.rnnt_cuda import THREADS, _on

NEG_INF = -math.inf


def _lse(a, c):
    if a == NEG_INF or c == NEG_INF:
        return max(a, c)
    return max(a, c) + math.log1p(math.exp(-abs(a - c)))


def _reduce(sm, tid, nt, use_max):
    """Shared-memory tree reduction (max or sum) over ``nt`` (a power of two) threads; the result in sm[0]."""
    cuda.syncthreads()
    s = nt // 2
    while s > 0:
        if tid < s:
            sm[tid] = max(sm[tid], sm[tid + s]) if use_max else sm[tid] + sm[tid + s]
        cuda.syncthreads()
        s //= 2


def _durations_row(acts, b, t, u, V, D, fused, grads, lpd):
    """Thread 0: the duration log-softmax of node (b, t, u) into ``lpd``, its softmax into the buffer."""
    m = acts[b, t, u, V] if fused else 0.0
    for k in range(1, D):
        m = max(m, acts[b, t, u, V + k]) if fused else 0.0
    s = 0.0
    for k in range(D):
        s += math.exp(acts[b, t, u, V + k] - m) if fused else 0.0
    norm = m + math.log(s) if fused else 0.0
    for k in range(D):
        lpd[b, t, u, k] = acts[b, t, u, V + k] - norm
        grads[b, t, u, V + k] = math.exp(lpd[b, t, u, k]) if fused else 0.0


def rows_kernel(acts, targets, tlen, ulen, blank, fused, sigma, grads, lpb, lpy, lpd, logs, holder):
    """Pass 1 per node (``acts`` and ``grads`` may be one array: thread 0 reads what it writes first)."""
    B, T, U1, W = acts.shape
    D = lpd.shape[3]
    V = W - D
    b, t, u = cuda.blockIdx.x // (T * U1), (cuda.blockIdx.x // U1) % T, cuda.blockIdx.x % U1
    tid, nt, Tb, Ub = cuda.threadIdx.x, cuda.blockDim.x, min(tlen[b], T), min(ulen[b], U1 - 1)
    sm = cuda.shared.array(THREADS, numba.float64)
    if t >= Tb or u > Ub:
        for v in range(tid, W, nt):
            grads[b, t, u, v] = 0
        return
    xb, xy = 0.0, 0.0
    if tid == 0:
        xb = acts[b, t, u, blank]
        xy = acts[b, t, u, min(max(targets[b, u], 0), V - 1)] if u < Ub else xb
        _durations_row(acts, b, t, u, V, D, fused, grads, lpd)
    m = NEG_INF
    for v in range(tid, V, nt):
        m = max(m, acts[b, t, u, v])
    sm[tid] = m
    _reduce(sm, tid, nt, True)
    if tid == 0:
        holder[b, t, u] = sm[0] if fused else 0.0
    cuda.syncthreads()
    mf = holder[b, t, u]
    acc = 0.0
    for v in range(tid, V, nt):
        e = math.exp(acts[b, t, u, v] - mf) if fused else 0.0
        grads[b, t, u, v] = e
        acc += e
    sm[tid] = acc
    _reduce(sm, tid, nt, False)
    if tid == 0:
        d = 0.0
        if fused:
            logs[b, t, u] = math.log(sm[0])
            d = mf + logs[b, t, u]
        lpb[b, t, u] = xb - d - sigma
        lpy[b, t, u] = xy - d - sigma


def _alpha_node(b, t, u, durs, lpb, lpy, lpd, alpha):
    a = 0.0 if t == 0 and u == 0 else NEG_INF
    for k in range(durs.shape[0]):
        d = durs[k]
        s = t - d
        if s >= 0:
            if d > 0:
                a = _lse(a, alpha[b, s, u] + lpb[b, s, u] + lpd[b, s, u, k])
            if u > 0:
                a = _lse(a, alpha[b, s, u - 1] + lpy[b, s, u - 1] + lpd[b, s, u - 1, k])
    alpha[b, t, u] = a


def _beta_node(b, t, u, Tb, Ub, durs, lpb, lpy, lpd, beta):
    c = NEG_INF
    for k in range(durs.shape[0]):
        d = durs[k]
        n = t + d
        if d > 0 and n < Tb:
            c = _lse(c, beta[b, n, u] + lpb[b, t, u] + lpd[b, t, u, k])
        elif d > 0 and n == Tb and u == Ub:
            c = _lse(c, lpb[b, t, u] + lpd[b, t, u, k])
        if u < Ub and n < Tb:
            c = _lse(c, beta[b, n, u + 1] + lpy[b, t, u] + lpd[b, t, u, k])
    beta[b, t, u] = c


def alpha_beta_kernel(durs, lpb, lpy, lpd, tlen, ulen, alpha, beta, ll):
    """Pass 2: block (b, 0) the alphas and the log-likelihood, block (b, 1) the betas, by anti-diagonals."""
    B, T, U1 = lpb.shape
    b, which = cuda.blockIdx.x, cuda.blockIdx.y
    tid, nt, Tb, Ub = cuda.threadIdx.x, cuda.blockDim.x, min(tlen[b], T), min(ulen[b], U1 - 1)
    if Tb == 0:
        if tid == 0 and which == 0:
            ll[b] = NEG_INF
        return
    last = Tb - 1 + Ub
    for n in range(last + 1):
        for u in range(tid, Ub + 1, nt):
            if which == 0 and 0 <= n - u < Tb:
                _alpha_node(b, n - u, u, durs, lpb, lpy, lpd, alpha)
            elif which == 1 and 0 <= last - n - u < Tb:
                _beta_node(b, last - n - u, u, Tb, Ub, durs, lpb, lpy, lpd, beta)
        cuda.syncthreads()
    if tid == 0 and which == 0:
        x = NEG_INF
        for k in range(durs.shape[0]):
            s = Tb - durs[k]
            if durs[k] > 0 and s >= 0:
                x = _lse(x, alpha[b, s, Ub] + lpb[b, s, Ub] + lpd[b, s, Ub, k])
        ll[b] = x


def _arcs(b, t, u, V, Tb, Ub, blank, lab, base, durs, beta, lpb, lpy, lpd, grads):
    for k in range(durs.shape[0]):
        d = durs[k]
        n = t + d
        pb, py = 0.0, 0.0
        if d > 0 and n < Tb:
            pb = math.exp(base + lpb[b, t, u] + lpd[b, t, u, k] + beta[b, n, u])
        elif d > 0 and n == Tb and u == Ub:
            pb = math.exp(base + lpb[b, t, u] + lpd[b, t, u, k])
        if u < Ub and n < Tb:
            py = math.exp(base + lpy[b, t, u] + lpd[b, t, u, k] + beta[b, n, u + 1])
            grads[b, t, u, lab] -= py
        grads[b, t, u, blank] -= pb
        grads[b, t, u, V + k] -= pb + py


def grads_kernel(durs, targets, tlen, ulen, blank, fused, alpha, beta, lpb, lpy, lpd, logs, ll, holder, grads):
    """Pass 3 per node, in place over pass 1's buffer; an utterance with no path gets zeros."""
    B, T, U1, W = grads.shape
    V = W - durs.shape[0]
    row = cuda.blockIdx.x
    b, t, u = row // (T * U1), (row // U1) % T, row % U1
    tid, nt, Tb, Ub = cuda.threadIdx.x, cuda.blockDim.x, min(tlen[b], T), min(ulen[b], U1 - 1)
    if t >= Tb or u > Ub:
        return
    if ll[b] == NEG_INF:
        for v in range(tid, W, nt):
            grads[b, t, u, v] = 0
        return
    base = alpha[b, t, u] - ll[b]
    if fused:
        if tid == 0:
            holder[b, t, u] = math.exp(base + beta[b, t, u] - logs[b, t, u])
        cuda.syncthreads()
        f = holder[b, t, u]
        for v in range(tid, V, nt):
            grads[b, t, u, v] *= f
        cuda.syncthreads()
    if tid == 0:
        if fused:
            occupancy = math.exp(base + beta[b, t, u])
            for k in range(W - V):
                grads[b, t, u, V + k] *= occupancy
        lab = min(max(targets[b, u], 0), V - 1) if u < Ub else 0
        _arcs(b, t, u, V, Tb, Ub, blank, lab, base, durs, beta, lpb, lpy, lpd, grads)


_COMPILED: dict = {}
_PLAIN = {f.__name__: f for f in (_lse, _reduce, _durations_row, _alpha_node, _beta_node, _arcs)}


def use_helpers(device_jit) -> None:
    """Put the kernels' helpers under their names in this module, compiled by ``device_jit``: the kernels
    read them as globals (numba.cuda at compile time, the simulator at run time, as plain Python)."""
    globals().update({name: device_jit(f) for name, f in _PLAIN.items()})


def kernels(jit=None) -> dict:
    """The three kernels compiled by ``jit`` (default ``numba.cuda.jit``, once per process, with the helpers
    as inlined numba.cuda device functions)."""
    if jit is None:
        if not _COMPILED:
            use_helpers(functools.partial(cuda.jit, device=True, inline=True))
            _COMPILED.update(kernels(functools.partial(cuda.jit, cache=True)))
        return _COMPILED
    return {"rows": jit(rows_kernel), "alpha_beta": jit(alpha_beta_kernel), "grads": jit(grads_kernel)}


def run(k: dict, a: dict, blank: int, fused: bool, sigma: float, stream=0, threads: int = THREADS,
        lattice: int = 1024) -> None:
    """The three launches over device arrays ``a`` (as rnnt_cuda.run's, plus durs and lpd)."""
    B, T, U1, _ = a["acts"].shape
    nodes = B * T * U1
    lattice_threads = min(lattice, 32 * -(-U1 // 32))
    if nodes:
        k["rows"][nodes, threads, stream](a["acts"], a["targets"], a["tlen"], a["ulen"], blank, fused, sigma,
                                          a["grads"], a["lpb"], a["lpy"], a["lpd"], a["logs"], a["holder"])
    if B:
        k["alpha_beta"][(B, 2), lattice_threads, stream](a["durs"], a["lpb"], a["lpy"], a["lpd"], a["tlen"],
                                                         a["ulen"], a["alpha"], a["beta"], a["ll"])
    if nodes:
        k["grads"][nodes, threads, stream](a["durs"], a["targets"], a["tlen"], a["ulen"], blank, fused, a["alpha"],
                                           a["beta"], a["lpb"], a["lpy"], a["lpd"], a["logs"], a["ll"],
                                           a["holder"], a["grads"])


def _work(B, T, U1, D, make) -> dict:
    """The lattice's float64 work arrays, each made by ``make(shape)`` (filled with -inf)."""
    out = {name: make((B, T, U1)) for name in ("lpb", "lpy", "logs", "alpha", "beta")}
    out["lpd"] = make((B, T, U1, D))
    return out


def forward(logits: torch.Tensor, targets, logit_lengths, target_lengths, durations, blank: int, fused: bool,
            sigma: float):
    """(costs (B,) float32 (float64 for float64 logits), gradient in the logits' dtype) for CUDA tensors."""
    dev = logits.device
    half = logits.dtype in (torch.bfloat16, torch.float16)
    work = logits.float().contiguous() if half else logits.contiguous()  # (B, T, U+1, V+D)
    grads = work if half else torch.empty_like(work)
    B, T, U1, _ = work.shape
    t = {"acts": work, "grads": grads, "targets": _on(targets, dev), "tlen": _on(logit_lengths, dev),
         "ulen": _on(target_lengths, dev), "ll": torch.empty(B, dtype=torch.float64, device=dev),
         "holder": torch.empty((B, T, U1), dtype=work.dtype, device=dev),
         "durs": _on(torch.tensor(list(durations)), dev)}
    t.update(_work(B, T, U1, len(durations),
                   lambda shape: torch.full(shape, NEG_INF, dtype=torch.float64, device=dev)))
    with cuda.gpus[dev.index if dev.index is not None else torch.cuda.current_device()]:
        stream = cuda.external_stream(torch.cuda.current_stream(dev).cuda_stream)
        run(kernels(), {k: cuda.as_cuda_array(v, sync=False) for k, v in t.items()}, int(blank), bool(fused),
            float(sigma), stream)
    costs = (-t["ll"]).to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
    return costs, grads.to(logits.dtype)


def simulate(acts: np.ndarray, grads: np.ndarray, targets, tlen, ulen, durations, blank: int, fused: bool,
             sigma: float = 0.0, threads: int = 4, lattice: int = 2):
    """The kernels on numpy arrays through numba's CUDA simulator (no GPU): the log-likelihood (B,),
    ``grads`` filled. For the tests; tiny shapes only."""
    from numba.cuda import simulator

    B, T, U1, _ = acts.shape
    host = {"acts": acts, "grads": grads, "targets": targets, "tlen": tlen, "ulen": ulen, "ll": np.empty(B),
            "holder": np.empty((B, T, U1), acts.dtype), "durs": np.asarray(durations, np.int64)}
    host.update(_work(B, T, U1, len(durations), lambda shape: np.full(shape, NEG_INF)))
    dev = {k: simulator.to_device(v) for k, v in host.items()}
    if grads is acts:
        dev["grads"] = dev["acts"]
    use_helpers(lambda f: f)  # plain Python, as the simulator runs them
    run(kernels(simulator.jit), dev, blank, fused, sigma, threads=threads, lattice=lattice)
    grads[...] = dev["grads"].copy_to_host()
    return dev["ll"].copy_to_host()
