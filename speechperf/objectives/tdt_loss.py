"""The Token-and-Duration Transducer loss (TDT; Xu et al. 2023, "Efficient Sequence Transduction by
Jointly Predicting Tokens and Durations", Parakeet-TDT's): :func:`tdt_loss` checks its inputs and
runs a compiled kernel on the tensors' device, as :func:`~speechperf.objectives.rnnt_loss.rnnt_loss`.

Semantics. ``logits`` (B, T, U+1, V+D): per frame t and label prefix u, V token logits (the blank
among them) then D duration logits, one per entry of ``durations`` (distinct, >= 0, at least one
> 0). Tokens and durations have separate log-softmaxes, P_T(v | t, u) and P_D(d | t, u). A path
starts at (0, 0); at (t, u) it emits label ``targets[u]`` with a duration d (any of ``durations``)
to (t+d, u+1), or the blank with a duration d >= 1 to (t+d, u); each arc's probability is
P_T(token) P_D(d). It ends with a blank that lands exactly on frame T_b from (T_b - d, U_b);
no arc may land past T_b - 1 otherwise. The loss is -log of the sum over paths (the paper's
alpha recursion, Eq. 7; NeMo's TDT loss with the same duration list gives the same value).

Reductions that hold. The set {0, 1} is not RNN-T: a label there may also take a frame (d=1), and
every arc pays P_D; RNN-T is the TDT whose label arcs have d=0 and blank arcs d=1 with P_D = 1,
which one shared duration distribution per node cannot express. The set {1} is the monotonic
transducer (one symbol per frame, the last frame's a blank): its P_D is 1. Both are tested against
independent enumerations (tests/objectives/test_tdt_loss.py).

Impossible utterances: T_b = 0 (no frames), and where ``durations`` cannot add up to T_b with U_b
labels and at least one blank (without 0: U_b + 1 > T_b where 1 is in the set). Their loss is
+inf and their gradient zero, as the RNN-T loss's T_b = 0; :func:`possible` says which, from
CPU lengths.

``sigma`` (the paper's logit under-normalisation, NeMo's ``sigma``; default 0): every token
log-probability is lowered by sigma, so a path of more arcs pays more (training only; 0 is the
plain loss). NeMo's ``omega`` (mixing in the plain RNN-T loss) is not implemented.

``fused_log_softmax`` and precision as the RNN-T loss's (one gradient buffer the size of the
logits, float64 lattice, half-precision logits through a float32 copy). The kernels: ``tdt_cpu``
(numba), ``tdt_cuda`` (numba-cuda), ``tdt_reference`` (pure torch, the tests' and benchmark's).
"""
from __future__ import annotations

import torch

from speechperf.objectives.rnnt_loss import RNNTInputError, _check_shapes, _check_values, reduce, scaled_grads


def check_durations(durations) -> tuple[int, ...]:
    """``durations`` as a tuple of ints, or :class:`RNNTInputError` naming them."""
    ds = tuple(int(d) for d in durations)
    if not ds or len(set(ds)) != len(ds) or min(ds) < 0 or max(ds) < 1:
        raise RNNTInputError(f"tdt_loss: durations={list(durations)} must be distinct integers >= 0, "
                             "at least one >= 1 (the final blank's)")
    return ds


def check_inputs(logits, targets, logit_lengths, target_lengths, durations, blank: int = 0,
                 reduction: str = "none") -> tuple[int, ...]:
    """The durations as a tuple, or :class:`RNNTInputError` naming the first value the loss cannot take."""
    ds = check_durations(durations)
    if logits.dim() != 4 or logits.shape[-1] <= len(ds):
        raise RNNTInputError(f"tdt_loss: logits of shape {tuple(logits.shape)}, expected (B, T, U+1, V+D) "
                             f"with D = {len(ds)} duration logits after V >= 1 token logits")
    tokens = logits[..., : logits.shape[-1] - len(ds)]  # a view: the checks read shapes and CPU lengths only
    _check_shapes(tokens, targets, logit_lengths, target_lengths, blank, reduction)
    _check_values(tokens, targets, logit_lengths, target_lengths, blank)
    return ds


def possible(logit_lengths: torch.Tensor, target_lengths: torch.Tensor, durations) -> torch.Tensor:
    """(B,) bool: whether some path exists (CPU arithmetic on the lengths, any duration set): T_b must
    be a sum of U_b label durations and at least one blank duration (>= 1)."""
    ds = check_durations(durations)
    tl, ul = logit_lengths.long().cpu(), target_lengths.long().cpu()
    if 1 in ds:  # blanks of 1 fill any frames left: labels need d = 0, or a frame each and one for the blank
        return (tl >= 1) & ((ul + 1 <= tl) | (0 in ds))
    top = int(tl.max()) if len(tl) else 0
    out = torch.zeros(len(tl), dtype=torch.bool)
    for b, (T, U) in enumerate(zip(tl.tolist(), ul.tolist())):
        labels = {0}  # sums of U label durations, up to T
        for _ in range(U):
            labels = {s + d for s in labels for d in ds if s + d <= top}
        blanks, frontier = set(), {0}  # sums of >= 1 blank durations, up to T
        while frontier:
            frontier = {s + d for s in frontier for d in ds if d > 0 and s + d <= T} - blanks
            blanks |= frontier
        out[b] = any(T - s in blanks for s in labels)
    return out


def kernel_forward(logits, targets, logit_lengths, target_lengths, durations, blank: int, fused: bool, sigma: float):
    """(costs (B,), gradient (B, T, U+1, V+D) in the logits' dtype) from the kernel of the logits' device."""
    if logits.device.type == "cuda":
        from speechperf.objectives import tdt_cuda  # imports numba.cuda: only when a CUDA tensor arrives

        return tdt_cuda.forward(logits, targets, logit_lengths, target_lengths, durations, blank, fused, sigma)
    return _cpu_forward(logits, targets, logit_lengths, target_lengths, durations, blank, fused, sigma)


def _cpu_forward(logits, targets, logit_lengths, target_lengths, durations, blank, fused, sigma):
    from speechperf.objectives import tdt_cpu

    half = logits.dtype in (torch.bfloat16, torch.float16)
    work = logits.float().contiguous() if half else logits.contiguous()  # (B, T, U+1, V+D)
    grads = work if half else torch.empty_like(work)
    tgt = targets.to(torch.int64).contiguous().numpy()
    ll = tdt_cpu.run(work.numpy(), grads.numpy(), tgt, logit_lengths.to(torch.int64).numpy(),
                     target_lengths.to(torch.int64).numpy(), list(durations), int(blank), bool(fused), float(sigma))
    costs = torch.from_numpy(-ll).to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
    return costs, grads.to(logits.dtype)


class TDTLossFunction(torch.autograd.Function):
    """The kernel's costs with its gradient buffer saved; ``inplace`` as RNNTLossFunction's."""

    @staticmethod
    def forward(ctx, logits, targets, logit_lengths, target_lengths, durations, blank, fused, sigma, inplace):
        costs, grads = kernel_forward(logits.detach(), targets, logit_lengths, target_lengths, durations, blank,
                                      fused, sigma)
        ctx.save_for_backward(grads)
        ctx.inplace = inplace
        return costs

    @staticmethod
    def backward(ctx, grad_costs):
        return scaled_grads(ctx, grad_costs), *([None] * 8)  # over (B, T, U+1, V+D)


def tdt_loss(logits, targets, logit_lengths, target_lengths, durations, blank: int = 0, reduction: str = "none",
             fused_log_softmax: bool = True, sigma: float = 0.0) -> torch.Tensor:
    """The TDT negative log-likelihood of ``targets`` under ``logits`` (B, T, U+1, V+D): (B,) with
    ``reduction="none"``, else its mean or sum (the module's docstring has the semantics)."""
    ds = check_inputs(logits, targets, logit_lengths, target_lengths, durations, blank, reduction)
    costs = TDTLossFunction.apply(logits, targets, logit_lengths, target_lengths, ds, int(blank),
                                  bool(fused_log_softmax), float(sigma), True)
    return reduce(costs, reduction)
