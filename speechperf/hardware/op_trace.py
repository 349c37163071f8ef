"""Every op a computation runs and a digest of what it wrote: where two machines part.

The kernel fingerprints (hardware/kernel_fingerprint.py) test a few kernel families at fixed
shapes. Under the whole ISA cap an AMD EPYC and an Intel Xeon agree on all of them, yet their
reference curves still differ (docs/reproduce.md): the kernel that computes otherwise is one the
fingerprints do not run, or runs at other shapes. A trace answers without a guess. Inside
:class:`OpTrace` (a ``TorchDispatchMode``) every ATen op a training step calls is recorded in
order with its input shapes and the sha256 of every tensor it returned or wrote in place (a
view's, which are its base's bytes, and unwritten memory's are not hashed). Work outside ATen (the
numba RNN-T kernel) is not an op: a difference in it shows in the first op that reads it. Two
machines that start from the same bytes compute the same trace until the first op whose
kernel sums otherwise: :func:`first_difference` names it (op, shapes, position), and
everything after it differs by contagion, so only the first difference means anything.

Hashing reads every output once (about as much work as the op itself for the small CPU presets'
steps); the trace changes nothing in the computation it watches.
"""
from __future__ import annotations

import hashlib
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

DIGITS = 12  # hex digits of sha256 kept per op (2^48 values: a collision is not a concern)
# ops that return memory they did not write: their bytes are whatever the allocator held
UNINITIALIZED = {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided"}
# ops whose last outputs are scratch for their backward, partly unwritten (oneDNN's RNN workspace,
# the CTC forward variables past each utterance's length): only the first N outputs are results;
# a difference in the scratch shows in the backward's gradients
RESULTS = {"mkldnn_rnn_layer": 3, "_ctc_loss": 1}
# ops whose CPU code torch picks by the CPU's maker, not its ISA, so no ISA cap makes two makers agree:
# ATen's bernoulli_(p) draws with MKL's VSL stream on an Intel CPU and one draw of torch's generator
# per element elsewhere (aten/src/ATen/native/cpu/DistributionKernels.cpp); torch's CPU dropout
# (F.dropout, nn.Dropout, SDPA's dropout_p) draws its mask with it
BY_MAKER = {"aten.bernoulli_.float": "bernoulli_(p): MKL's VSL on Intel, torch's generator elsewhere",
            "aten.bernoulli.p": "bernoulli(x, p): MKL's VSL on Intel, torch's generator elsewhere",
            "aten.native_dropout.default": "dropout's mask: bernoulli_(p), MKL's VSL on Intel"}


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The tensor's values as bytes (any dtype: a uint8 view of a contiguous copy; 0-dim included)."""
    flat = t.detach().reshape(-1).contiguous()
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def written(func, args: tuple, kwargs: dict) -> list:
    """The arguments ``func`` writes to (its schema's ``Tensor(a!)``: in-place and ``out=`` ops,
    the optimizers' foreach updates), whose new values are the op's result."""
    out = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        out.append(args[i] if i < len(args) else kwargs.get(arg.name))
    return out


def is_view(func) -> bool:
    """Whether every result of ``func`` aliases an input without writing it (detach, view, t, ...)."""
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def shapes(args: tuple) -> str:
    """The tensor inputs' shapes, ``12x176,176x704`` (lists of tensors flattened)."""
    return ",".join("x".join(map(str, t.shape)) for t in tree_leaves(args) if isinstance(t, torch.Tensor))


class OpTrace(TorchDispatchMode):
    """Records ``[op, input shapes, digest]`` per ATen op called inside (``ops``)."""

    def __init__(self):
        super().__init__()
        self.ops: list[list[str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops.append([str(func), shapes(args), op_digest(func, out, args, kwargs)])
        return out


def op_digest(func, out, args: tuple, kwargs: dict) -> str:
    """The sha256 of what an op returned, then of what it wrote and did not return (``out=``'s is
    both); "-" for an op that returns unwritten memory."""
    name = func._schema.name.split("::")[-1]
    if name in UNINITIALIZED:
        return "-"
    if is_view(func):  # its bytes are its base's, digested by the op that wrote them (or, written
        return "="     # outside ATen, as the numba RNN-T kernel writes its gradient, by the ops that read them)
    results = tree_leaves(out[:RESULTS[name]] if name in RESULTS else out)
    seen = {id(t) for t in results}
    h = hashlib.sha256()
    for t in results + [t for t in tree_leaves(written(func, args, kwargs)) if id(t) not in seen]:
        if isinstance(t, torch.Tensor):
            h.update(tensor_bytes(t))
        elif isinstance(t, (int, float, bool, str)):
            h.update(repr(t).encode())
        elif t is not None:  # an object (the profiler's record handle): its type, not its address
            h.update(type(t).__name__.encode())
    return h.hexdigest()[:DIGITS]


def first_difference(mine: list, theirs: list) -> dict | None:
    """None where the two traces are equal; else where they part: ``index`` (0-based), this
    trace's op and the other's (``[op, shapes, digest]``; None past an end), ``kind`` ("values":
    the same op computed otherwise; "sequence": another op ran, the dispatch chose otherwise) and
    how many positions differ after it (contagion: only the first names a culprit)."""
    n = min(len(mine), len(theirs))
    k = next((i for i in range(n) if list(mine[i]) != list(theirs[i])), None)
    if k is None:
        if len(mine) == len(theirs):
            return None
        k = n
    a = list(mine[k]) if k < len(mine) else None
    b = list(theirs[k]) if k < len(theirs) else None
    kind = "values" if a and b and a[:2] == b[:2] else "sequence"
    later = sum(list(x) != list(y) for x, y in zip(mine[k:], theirs[k:])) + abs(len(mine) - len(theirs))
    return {"index": k, "mine": a, "theirs": b, "kind": kind, "differing": later}


def by_maker(ops: list) -> dict[str, int]:
    """How many times a trace calls each op of :data:`BY_MAKER` (none: the trace's code is the
    same on both makers, whatever their kernels then compute)."""
    return dict(Counter(op[0] for op in ops if op[0] in BY_MAKER))


def trace_digest(ops: list) -> str:
    """One sha256 over a whole trace (its ops' names, shapes and digests, in order)."""
    h = hashlib.sha256()
    for op in ops:
        h.update("|".join(op).encode() + b"\n")
    return h.hexdigest()[:DIGITS]
