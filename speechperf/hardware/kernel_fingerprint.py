"""Which kernels compute a training otherwise on two machines: a fingerprint per kernel family.

Under the whole ISA cap (hardware/isa_cap.py), at one thread, with the same torch and
features, a reference seed's curve still differs between an Intel Xeon and an AMD EPYC
(docs/reproduce.md), while two AMD generations agree. Three libraries could follow the maker:
MKL (float32 matrix products), oneDNN (convolutions and LSTMs: some of its kernels pick their
blocking from the cache sizes they read, and a different blocking sums in another order) and
ATen's own vectorized kernels. A curve that differs names no culprit, so a capped run records
the sha256 of a few fixed computations per family, at the shapes of the CPU presets: two
machines whose fingerprints agree on a family compute it alike; the families that differ are
the ones that make the curves differ. ``speechperf reproduce`` names them
(studies/curve.py), so one run on each maker answers the question.

The inputs come from a generator of their own, at one thread, with torch's global random state
saved and restored: recording the fingerprints changes nothing in the training that follows.
About a second of one core (oneDNN compiles its kernels on first use); computed only where a cap is
set (a reproduction, a reference curve).
"""
from __future__ import annotations

import contextlib
import hashlib

import torch
import torch.nn.functional as F

SEED = 20261206  # the inputs' generator seed: fixed for ever (a new seed makes every recorded fingerprint stale)
DIGITS = 16  # hex digits of sha256 kept per fingerprint
PREFIX = "kernel_"  # a fingerprint's key among a curve's settings (kernel_mm, kernel_lstm ...)


def digest(*tensors: torch.Tensor) -> str:
    """The first :data:`DIGITS` hex digits of the sha256 of the tensors' bytes, in order."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:DIGITS]


@contextlib.contextmanager
def one_thread():
    """torch at one intra-op thread inside, the caller's count restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _mm(g: torch.Generator) -> dict:
    """A float32 matrix product (torch.mm: MKL's sgemm in torch's CPU build), an odd-sized one."""
    a, b = torch.randn(300, 517, generator=g), torch.randn(517, 129, generator=g)
    return {"mm": digest(torch.mm(a, b))}


def _conv(g: torch.Generator) -> dict:
    """DS2's front end at the ``cpu`` preset's size: Conv1d 93 -> 256, kernel 11, stride 2 (oneDNN),
    forward and both gradients (oneDNN's backward-data kernel reads the L2 cache size)."""
    x = torch.randn(8, 93, 400, generator=g).requires_grad_()
    w = torch.randn(256, 93, 11, generator=g).mul_(0.05).requires_grad_()
    y = F.conv1d(x, w, stride=2)  # (8, 93, 400) -> (8, 256, 195)
    y.backward(torch.randn(y.shape, generator=g))
    return {"conv1d": digest(y), "conv1d_backward": digest(x.grad, w.grad)}


def _lstm(g: torch.Generator) -> dict:
    """A 256-unit LSTM layer (the ``cpu`` preset's width; oneDNN's RNN on a CPU), forward and backward."""
    lstm = torch.nn.LSTM(256, 256, batch_first=True)
    with torch.no_grad():
        for p in lstm.parameters():
            p.copy_(torch.randn(p.shape, generator=g).mul_(0.06))
    x = torch.randn(8, 100, 256, generator=g).requires_grad_()
    y, _ = lstm(x)  # (8, 100, 256)
    y.backward(torch.randn(y.shape, generator=g))
    grads = [p.grad for p in lstm.parameters()]
    return {"lstm": digest(y), "lstm_backward": digest(x.grad, *grads)}


def _aten(g: torch.Generator) -> dict:
    """ATen's vectorized kernels: log-softmax, tanh, layer norm and a long sum."""
    x = torch.randn(64, 1000, generator=g)
    return {"elementwise": digest(F.log_softmax(x, -1), torch.tanh(x), F.layer_norm(x, (1000,)),
                                  x.sum(0), x.exp().sum())}


def fingerprints() -> dict[str, str]:
    """{kernel family: fingerprint} for this process's kernels (the ISA cap it was started under)."""
    out = {}
    with torch.random.fork_rng(devices=[]), one_thread():
        g = torch.Generator().manual_seed(SEED)
        for family in (_mm, _conv, _lstm, _aten):
            out.update(family(g))
    return out


def differing(mine: dict, theirs: dict) -> list[str] | None:
    """The kernel families whose fingerprints differ between two runs' settings (studies/curve.py's,
    which hold each as ``kernel_FAMILY``); None where either side recorded none."""
    a, b = ({k[len(PREFIX):]: v for k, v in s.items() if k.startswith(PREFIX) and v} for s in (mine, theirs))
    if not a or not b:
        return None
    return [k for k in sorted(a.keys() & b.keys()) if a[k] != b[k]]


def as_settings(kernels: dict | None) -> dict:
    """``{"kernel_mm": ..., ...}``: the fingerprints as flat settings of a curve (strings only)."""
    return {PREFIX + k: v for k, v in (kernels or {}).items()}
