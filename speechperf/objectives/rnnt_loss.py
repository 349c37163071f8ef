"""The full-lattice RNN-T loss (Graves 2012), with the semantics of torchaudio's ``rnnt_loss``
and warp-transducer: :func:`rnnt_loss` is the one entry; it checks its inputs and runs a
compiled kernel on the tensors' device.

Semantics. ``logits`` (B, T, U+1, V) are the joint network's outputs for frame t and label
prefix u; ``targets`` (B, U) the padded label sequences. A path through the lattice starts at
(0, 0); at (t, u) it emits blank (to (t+1, u)) or label ``targets[u]`` (to (t, u+1)), any number
of labels per frame, and ends with a blank at (T_b-1, U_b), T_b = ``logit_lengths[b]`` and
U_b = ``target_lengths[b]``. The loss is -log of the sum over paths of the product of their
transitions' probabilities, per utterance. Every (T_b >= 1, U_b) has a path (labels need no
frame of their own), so the one impossible alignment is T_b = 0: its loss is +inf and its
gradient zero, and the caller zeroes or counts it as it does CTC's (``zero_infinity``).
Padding (t >= T_b, u > U_b, targets[b, u >= U_b]) is never read for the loss and gets a zero
gradient.

``fused_log_softmax=True``: ``logits`` are unnormalised; the kernel takes the log-softmax over
V itself and, in the forward, writes the gradient with respect to the logits (the node's
posterior times the softmax, less the posteriors of the blank and label transitions leaving the
node, as warp-transducer does) into ONE buffer the size of ``logits``. That buffer is the only
(B, T, U+1, V) tensor autograd keeps; the backward scales it by the output's gradient in place
(so a second backward through the same graph fails with torch's in-place error rather than
returning a wrong gradient). ``fused_log_softmax=False``: ``logits`` are log-probabilities
already and the gradient is with respect to them (nonzero only at blank and at the labels).

Precision: the logits may be float32, bfloat16, float16 (or float64, for ``gradcheck``); the
kernels work in float32 (float64 for float64 logits): half-precision logits are copied to float32
for the forward, that copy becomes the gradient buffer, which is cast back to the logits' dtype
at the forward's end. The lattice (alpha, beta, the log-softmax's normaliser) is float64 in
both kernels: it costs O(B T U) against the O(B T U V) of the softmax, and a float32 one is not
exact enough for the gradient: alpha + beta reaches -1000 to -2000 nats at T = 300-700, U = 60-150,
where a float32's step is 1e-4, and the posteriors exp(alpha + beta - ll) carry that error: the
gradient moved by up to 1.4e-4 (T 100, U 30, V 128), 3.3e-4 (T 300, U 60, V 32) and 1e-3
(T 700, U 150, V 16) against 5e-8 with float64, the loss by up to 3e-7 relative (measured on
random logits; tests/objectives/test_rnnt_loss.py keeps a T 300, U 60 case).
The loss is returned in float32 (float64 for float64 logits).

Which kernel runs where: CPU tensors go to ``rnnt_cpu`` (numba, parallel over the batch's
frames), CUDA tensors to ``rnnt_cuda`` (numba-cuda kernels on torch's current stream; numba.cuda
is imported only when a CUDA tensor arrives). ``rnnt_reference`` is the same loss in plain torch
operations (autograd through an anti-diagonal recursion), the tests' and the benchmark's
reference.

Memory (:func:`joint_bytes`): the logits, the gradient buffer the size of the logits (kept from
the forward to the backward), a float32 working copy during the forward when the logits are half
precision, and O(B T U) lattice arrays.

Checks: shapes, dtypes, ``blank`` and, where the lengths and targets are CPU tensors, their values
(lengths within the padded T and U, labels within the vocabulary) raise :class:`RNNTInputError`
(a ValueError) naming the value. Lengths or targets already on a CUDA device are not read back:
that would make the host wait for the device; the CUDA kernels clip the lengths to the padded
shape so that memory stays safe, and the caller (the model contract plans its lengths on the
CPU) passes CPU lengths to have them checked.
"""
from __future__ import annotations

import torch

from speechperf.errors import SpeechperfError
from speechperf.objectives import rnnt_cpu

REDUCTIONS = ("none", "mean", "sum")
FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
LATTICE_BYTES = 5 * 8 + 4  # per (b, t, u): alpha, beta, blank and label log-probs, log normaliser (f64), a scale


class RNNTInputError(SpeechperfError, ValueError):
    """Inputs the RNN-T loss cannot take: the message names the argument and its value."""


def _check_shapes(logits, targets, logit_lengths, target_lengths, blank: int, reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise RNNTInputError(f"rnnt_loss: reduction={reduction!r}, expected one of {', '.join(REDUCTIONS)}")
    if logits.dim() != 4 or logits.dtype not in FLOATS:
        raise RNNTInputError(f"rnnt_loss: logits of shape {tuple(logits.shape)} and dtype {logits.dtype}, "
                             "expected (B, T, U+1, V) float32, bfloat16, float16 or float64")
    B, T, U1, V = logits.shape
    if targets.dim() != 2 or targets.shape[0] != B or targets.shape[1] != U1 - 1:
        raise RNNTInputError(f"rnnt_loss: targets of shape {tuple(targets.shape)}, expected (B, U) = ({B}, {U1 - 1}) "
                             f"for logits of shape {tuple(logits.shape)}")
    for name, x in (("targets", targets), ("logit_lengths", logit_lengths), ("target_lengths", target_lengths)):
        if x.dtype not in (torch.int32, torch.int64):
            raise RNNTInputError(f"rnnt_loss: {name} of dtype {x.dtype}, expected int32 or int64")
        if x.device.type not in ("cpu", logits.device.type):
            raise RNNTInputError(f"rnnt_loss: {name} on {x.device}, logits on {logits.device}")
    for name, x in (("logit_lengths", logit_lengths), ("target_lengths", target_lengths)):
        if tuple(x.shape) != (B,):
            raise RNNTInputError(f"rnnt_loss: {name} of shape {tuple(x.shape)}, expected ({B},)")
    if not 0 <= blank < V:
        raise RNNTInputError(f"rnnt_loss: blank={blank} outside the vocabulary of {V} (logits' last dimension)")


def _check_values(logits, targets, logit_lengths, target_lengths, blank: int) -> None:
    """The lengths and labels, where they are on the CPU (reading a device's would make the host wait)."""
    B, T, U1, V = logits.shape
    for name, x, top in (("logit_lengths", logit_lengths, T), ("target_lengths", target_lengths, U1 - 1)):
        if x.device.type == "cpu" and B and (int(x.min()) < 0 or int(x.max()) > top):
            b = int(((x < 0) | (x > top)).nonzero()[0, 0])
            padded = "frames" if name == "logit_lengths" else "labels (targets' padded U)"
            raise RNNTInputError(f"rnnt_loss: {name}[{b}]={int(x[b])} outside 0..{top}, the logits' {padded}")
    if targets.device.type == "cpu" and target_lengths.device.type == "cpu" and targets.numel():
        used = torch.arange(U1 - 1) < target_lengths[:, None]  # (B, U): the labels each utterance has
        bad = used & ((targets < 0) | (targets >= V) | (targets == blank))
        if bool(bad.any()):
            b, u = (int(i) for i in bad.nonzero()[0])
            raise RNNTInputError(f"rnnt_loss: targets[{b}, {u}]={int(targets[b, u])} is not a label of a vocabulary "
                                 f"of {V} with blank={blank}")


def check_inputs(logits, targets, logit_lengths, target_lengths, blank: int = 0, reduction: str = "none") -> None:
    """Raise :class:`RNNTInputError` naming the first argument or value the loss cannot take."""
    _check_shapes(logits, targets, logit_lengths, target_lengths, blank, reduction)
    _check_values(logits, targets, logit_lengths, target_lengths, blank)


def reduce(costs: torch.Tensor, reduction: str) -> torch.Tensor:
    """Per-utterance costs (B,) as ``reduction`` asks: as they are, their mean over the batch, their sum."""
    if reduction == "mean":
        return costs.mean()
    return costs.sum() if reduction == "sum" else costs


def kernel_forward(logits, targets, logit_lengths, target_lengths, blank: int, fused: bool):
    """(costs (B,), gradient (B, T, U+1, V) in the logits' dtype) from the kernel of the logits' device."""
    if logits.device.type == "cuda":
        from speechperf.objectives import rnnt_cuda  # imports numba.cuda: only when a CUDA tensor arrives

        return rnnt_cuda.forward(logits, targets, logit_lengths, target_lengths, blank, fused)
    return rnnt_cpu.forward(logits, targets, logit_lengths, target_lengths, blank, fused)


class RNNTLossFunction(torch.autograd.Function):
    """The kernel's costs, with its gradient buffer as the one saved tensor. ``inplace``: the
    backward scales the buffer in place (the loss's use); False keeps it, so that a graph may be
    differentiated again (``gradcheck``)."""

    @staticmethod
    def forward(ctx, logits, targets, logit_lengths, target_lengths, blank, fused, inplace):
        costs, grads = kernel_forward(logits.detach(), targets, logit_lengths, target_lengths, blank, fused)
        ctx.save_for_backward(grads)
        ctx.inplace = inplace
        return costs

    @staticmethod
    def backward(ctx, grad_costs):
        return scaled_grads(ctx, grad_costs), None, None, None, None, None, None


def scaled_grads(ctx, grad_costs: torch.Tensor) -> torch.Tensor:
    """A lattice loss's backward: its saved gradient buffer (B, T, U+1, W) times each utterance's incoming
    gradient, in place where ``ctx.inplace`` (the RNN-T and the TDT loss alike)."""
    (grads,) = ctx.saved_tensors
    scale = grad_costs.to(grads.dtype).view(-1, 1, 1, 1)  # (B,) -> (B, 1, 1, 1)
    return grads.mul_(scale) if ctx.inplace else grads * scale


def rnnt_loss(logits, targets, logit_lengths, target_lengths, blank: int = 0,
              reduction: str = "none", fused_log_softmax: bool = True) -> torch.Tensor:
    """The RNN-T negative log-likelihood of ``targets`` under ``logits`` (B, T, U+1, V): (B,)
    with ``reduction="none"``, else its mean or sum over the batch (the module's docstring has the
    semantics, precision, memory and which kernel runs where)."""
    check_inputs(logits, targets, logit_lengths, target_lengths, blank, reduction)
    costs = RNNTLossFunction.apply(logits, targets, logit_lengths, target_lengths, int(blank),
                                   bool(fused_log_softmax), True)
    return reduce(costs, reduction)


def joint_bytes(batch: int, frames: int, labels_plus_one: int, vocab: int, dtype=torch.float32) -> int:
    """Bytes at the loss's peak for a joint of (batch, frames, labels_plus_one, vocab) in ``dtype``: the
    joint itself, the gradient buffer kept for the backward (same dtype), the float32 working copy a
    half-precision joint needs during the forward, and the lattice arrays. The joint network's own
    activations (its hidden layer, autograd's saved inputs) are the caller's to add."""
    cells = batch * frames * labels_plus_one
    item = torch.empty((), dtype=dtype).element_size()
    work = 4 if item < 4 else 0  # the float32 copy of a bf16/fp16 joint, alive until the forward's end
    return cells * vocab * (2 * item + work) + cells * LATTICE_BYTES
