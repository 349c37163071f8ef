"""The RNN-T loss's CUDA kernels (numba.cuda), the CPU kernel's three passes (rnnt_cpu.py) on a GPU:

1. ``rows_kernel``: one block per lattice node (b, t, u), its threads striding over V: max and sum
   of exp reduced in shared memory (float64 sums), exp(x - max) written into the gradient buffer,
   blank's and the next label's log-probabilities and the log normaliser (float64).
2. ``alpha_beta_kernel``: grid (B, 2), one block computing an utterance's alphas and another its
   betas, the block's threads over u, one anti-diagonal t + u per step (a ``syncthreads`` between
   diagonals); float64.
3. ``grads_kernel``: one block per node again: the buffer scaled by the node's posterior over the
   normaliser, less the posteriors of the blank and label transitions leaving it.

Why numba.cuda (measured choices, written down): it is the one GPU route whose kernels run here on
the CPU, in process, through numba's CUDA simulator (Triton is not installed with the CPU build of
torch, and its interpreter needs it), so the tests compare these kernels with the CPU kernel pass by
pass; it is what NeMo's ``warprnnt_numba`` loss uses at scale; and the kernels' work is
bandwidth-bound (rows and gradients read and write each logit a bounded number of times) with
the recursion O(T + U) sequential steps of one block per utterance, where torch operations
(rnnt_reference.py) pay T + U launches of several small kernels each, and keep three more
(B, T, U+1, V) tensors for autograd.

Launches go to torch's current stream (``cuda.external_stream``); the arrays are handed over by
``__cuda_array_interface__`` without numba's synchronize (``sync=False``; the work is ordered by
the stream). Host syncs: none in the loss itself. Lengths and targets given as CPU tensors are copied
to the device from pinned memory without a wait; given on the device, they are not read on the host
at all (rnnt_loss.py checks CPU ones only) and the kernels clip them to the padded shape. Half
precision logits are copied to float32 by torch first (that copy is the gradient buffer, cast back at
the forward's end), as the CPU kernel does.

numba.cuda is imported when this module is (rnnt_loss.py imports it only when a CUDA tensor
arrives). The kernels are plain functions compiled by :func:`kernels` with ``numba.cuda.jit``, or, in
the tests, with the simulator's ``jit`` (numba.cuda.simulator), which needs no GPU and no
``NUMBA_ENABLE_CUDASIM`` set before the import: the simulator swaps this module's ``cuda`` for its own
while a kernel runs.
"""
from __future__ import annotations

import functools
import math

import numba
import numpy as np
import torch
from numba import cuda

THREADS = 128  # threads of a row block (a power of two: the shared-memory reductions halve it); shared arrays' size
NEG_INF = -math.inf


def rows_kernel(acts, targets, tlen, ulen, blank, fused, grads, lpb, lpy, logs, holder):
    """Pass 1 per node; ``acts`` and ``grads`` may be one array (thread 0 reads its two logits before the
    first ``syncthreads``; a thread writes only logits it read). ``holder``: the max in the logits' dtype."""
    B, T, U1, V = acts.shape
    b, t, u = cuda.blockIdx.x // (T * U1), (cuda.blockIdx.x // U1) % T, cuda.blockIdx.x % U1
    tid, nt, Tb, Ub = cuda.threadIdx.x, cuda.blockDim.x, min(tlen[b], T), min(ulen[b], U1 - 1)
    sm = cuda.shared.array(THREADS, numba.float64)
    if t >= Tb or u > Ub:
        for v in range(tid, V, nt):
            grads[b, t, u, v] = 0
        return
    xb, xy = 0.0, 0.0
    if tid == 0:
        xb = acts[b, t, u, blank]
        xy = acts[b, t, u, min(max(targets[b, u], 0), V - 1)] if u < Ub else xb
    m = NEG_INF
    for v in range(tid, V, nt):
        m = max(m, acts[b, t, u, v])
    sm[tid] = m
    cuda.syncthreads()
    s = nt // 2
    while s > 0:
        if tid < s:
            sm[tid] = max(sm[tid], sm[tid + s])
        cuda.syncthreads()
        s //= 2
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
    cuda.syncthreads()
    s = nt // 2
    while s > 0:
        if tid < s:
            sm[tid] += sm[tid + s]
        cuda.syncthreads()
        s //= 2
    if tid == 0:
        d = 0.0
        if fused:
            logs[b, t, u] = math.log(sm[0])
            d = mf + logs[b, t, u]
        lpb[b, t, u] = xb - d
        lpy[b, t, u] = xy - d


def alpha_beta_kernel(lpb, lpy, tlen, ulen, alpha, beta, ll):
    """Pass 2: block (b, 0) the alphas and the log-likelihood, block (b, 1) the betas, by anti-diagonals."""
    B, T, U1 = lpb.shape
    b, which = cuda.blockIdx.x, cuda.blockIdx.y
    tid, nt, Tb, Ub = cuda.threadIdx.x, cuda.blockDim.x, min(tlen[b], T), min(ulen[b], U1 - 1)
    if Tb == 0:
        if tid == 0 and which == 0:
            ll[b] = NEG_INF
        return
    last = Tb - 1 + Ub  # the last diagonal
    for n in range(last + 1):
        for u in range(tid, Ub + 1, nt):
            if which == 0 and 0 <= n - u < Tb:
                t = n - u
                a = 0.0 if n == 0 else NEG_INF
                c = alpha[b, t, u - 1] + lpy[b, t, u - 1] if u > 0 else NEG_INF
                if t > 0:
                    a = alpha[b, t - 1, u] + lpb[b, t - 1, u]
                if a == NEG_INF or c == NEG_INF:
                    alpha[b, t, u] = max(a, c)
                else:
                    alpha[b, t, u] = max(a, c) + math.log1p(math.exp(-abs(a - c)))
            elif which == 1 and 0 <= last - n - u < Tb:
                t = last - n - u
                a = lpb[b, t, u] if n == 0 else NEG_INF
                c = beta[b, t, u + 1] + lpy[b, t, u] if u < Ub else NEG_INF
                if t < Tb - 1:
                    a = beta[b, t + 1, u] + lpb[b, t, u]
                if a == NEG_INF or c == NEG_INF:
                    beta[b, t, u] = max(a, c)
                else:
                    beta[b, t, u] = max(a, c) + math.log1p(math.exp(-abs(a - c)))
        cuda.syncthreads()
    if tid == 0 and which == 0:
        ll[b] = alpha[b, Tb - 1, Ub] + lpb[b, Tb - 1, Ub]


def grads_kernel(targets, tlen, ulen, blank, fused, alpha, beta, lpb, lpy, logs, ll, holder, grads):
    """Pass 3 per node, in place over pass 1's buffer; ``holder`` carries the node's softmax factor in
    the buffer's dtype."""
    B, T, U1, V = grads.shape
    row = cuda.blockIdx.x
    b, t, u = row // (T * U1), (row // U1) % T, row % U1
    tid, nt, Tb, Ub = cuda.threadIdx.x, cuda.blockDim.x, min(tlen[b], T), min(ulen[b], U1 - 1)
    if t >= Tb or u > Ub:
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
        nb = NEG_INF
        if t < Tb - 1:
            nb = base + lpb[b, t, u] + beta[b, t + 1, u]
        elif u == Ub:
            nb = base + lpb[b, t, u]  # the final blank
        grads[b, t, u, blank] -= math.exp(nb)
        if u < Ub:
            lab = min(max(targets[b, u], 0), V - 1)
            grads[b, t, u, lab] -= math.exp(base + lpy[b, t, u] + beta[b, t, u + 1])


_COMPILED: dict = {}


def kernels(jit=None) -> dict:
    """The three kernels compiled by ``jit`` (default ``numba.cuda.jit``, once per process and signature)."""
    if jit is not None:
        return {"rows": jit(rows_kernel), "alpha_beta": jit(alpha_beta_kernel), "grads": jit(grads_kernel)}
    if not _COMPILED:  # cached on disk beside this module, as the CPU kernel is
        _COMPILED.update(kernels(functools.partial(cuda.jit, cache=True)))
    return _COMPILED


def run(k: dict, a: dict, blank: int, fused: bool, stream=0, threads: int = THREADS, lattice: int = 1024) -> None:
    """The three launches over device arrays ``a`` (acts, grads, targets, tlen, ulen, lpb, lpy, logs,
    alpha, beta, ll, holder). ``threads``: a row block's, a power of two <= THREADS; ``lattice``: the most
    a recursion block has (a stride loop over u beyond). The tests' simulator uses few of both."""
    B, T, U1, V = a["acts"].shape
    nodes = B * T * U1
    lattice_threads = min(lattice, 32 * -(-U1 // 32))  # a warp multiple covering u = 0..U
    if nodes:
        k["rows"][nodes, threads, stream](a["acts"], a["targets"], a["tlen"], a["ulen"], blank, fused, a["grads"],
                                          a["lpb"], a["lpy"], a["logs"], a["holder"])
    if B:
        k["alpha_beta"][(B, 2), lattice_threads, stream](
            a["lpb"], a["lpy"], a["tlen"], a["ulen"], a["alpha"], a["beta"], a["ll"])
    if nodes:
        k["grads"][nodes, threads, stream](a["targets"], a["tlen"], a["ulen"], blank, fused, a["alpha"], a["beta"],
                                           a["lpb"], a["lpy"], a["logs"], a["ll"], a["holder"], a["grads"])


def _on(x: torch.Tensor, device) -> torch.Tensor:
    """An int64 copy of ``x`` on ``device``, from pinned memory when it is on the CPU (the host does not wait)."""
    x = x.to(torch.int64).contiguous()
    return x.pin_memory().to(device, non_blocking=True) if x.device.type == "cpu" else x.to(device)


def forward(logits: torch.Tensor, targets, logit_lengths, target_lengths, blank: int, fused: bool):
    """(costs (B,) float32 (float64 for float64 logits), gradient in the logits' dtype) for CUDA tensors."""
    dev = logits.device
    half = logits.dtype in (torch.bfloat16, torch.float16)
    work = logits.float().contiguous() if half else logits.contiguous()  # (B, T, U+1, V), the kernels' dtype
    grads = work if half else torch.empty_like(work)
    B, T, U1, _ = work.shape
    t = {"acts": work, "grads": grads, "targets": _on(targets, dev), "tlen": _on(logit_lengths, dev),
         "ulen": _on(target_lengths, dev), "ll": torch.empty(B, dtype=torch.float64, device=dev),
         "holder": torch.empty((B, T, U1), dtype=work.dtype, device=dev)}
    for name in ("lpb", "lpy", "logs", "alpha", "beta"):
        t[name] = torch.full((B, T, U1), NEG_INF, dtype=torch.float64, device=dev)
    with cuda.gpus[dev.index if dev.index is not None else torch.cuda.current_device()]:
        stream = cuda.external_stream(torch.cuda.current_stream(dev).cuda_stream)
        run(kernels(), {k: cuda.as_cuda_array(v, sync=False) for k, v in t.items()}, int(blank), bool(fused), stream)
    costs = (-t["ll"]).to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
    return costs, grads.to(logits.dtype)


def simulate(acts: np.ndarray, grads: np.ndarray, targets, tlen, ulen, blank: int, fused: bool, threads: int = 4,
             lattice: int = 2):
    """The kernels on numpy arrays through numba's CUDA simulator (no GPU): the log-likelihood (B,),
    ``grads`` filled. For the tests; slow (a Python thread per GPU thread): tiny shapes only."""
    from numba.cuda import simulator  # numba's own CUDA simulator, importable without NUMBA_ENABLE_CUDASIM

    B, T, U1, _ = acts.shape
    host = {"acts": acts, "grads": grads, "targets": targets, "tlen": tlen, "ulen": ulen, "ll": np.empty(B),
            "holder": np.empty((B, T, U1), acts.dtype)}
    for name in ("lpb", "lpy", "logs", "alpha", "beta"):
        host[name] = np.full((B, T, U1), NEG_INF)
    if grads is acts:
        host["grads"] = host["acts"]
    dev = {k: simulator.to_device(v) for k, v in host.items()}
    if grads is acts:
        dev["grads"] = dev["acts"]  # one device array, as the half-precision path has
    run(kernels(simulator.jit), dev, blank, fused, threads=threads, lattice=lattice)
    grads[...] = dev["grads"].copy_to_host()
    return dev["ll"].copy_to_host()
