"""The RNN-T loss in plain torch operations, differentiated by autograd: the kernels' reference in
the tests and the benchmark's (benchmarks/run.py rnnt_loss). Same signature and semantics as
:func:`speechperf.objectives.rnnt_loss.rnnt_loss` (its docstring), without its memory economy:
autograd keeps the log-softmax's output (B, T, U+1, V), and its backward makes two more tensors of
that size (the gather's scattered gradient, the log-softmax's).

The forward variables are computed along anti-diagonals n = t + u: every node of a diagonal depends
on the previous diagonal only (alpha[t, u] from alpha[t-1, u] by a blank and alpha[t, u-1] by a
label), so each of the T + U steps is a few batch-wide operations on (B, U+1) tensors. The
lattice's log-probabilities are skewed once into diagonal order, (B, T+U, U+1), with nodes off the
lattice set to a large finite negative number rather than -inf (logaddexp's gradient at
(-inf, -inf) is NaN, which would reach the logits through the mask's zeros).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from speechperf.objectives.rnnt_loss import check_inputs, reduce

FAR = -1e30  # a log-probability of no path; finite, see the module's docstring


def _skew(x: torch.Tensor, diagonals: int) -> torch.Tensor:
    """x (B, T, W) -> (B, diagonals, W) with out[b, n, u] = x[b, n - u, u], FAR where n - u is off 0..T-1."""
    B, T, W = x.shape
    n = torch.arange(diagonals, device=x.device)[:, None]  # (N, 1)
    u = torch.arange(W, device=x.device)[None, :]  # (1, W)
    t = n - u  # (N, W): the frame of diagonal n's node u
    inside = (t >= 0) & (t < T)
    out = x[:, t.clamp(0, T - 1), u.expand_as(t)]  # (B, N, W)
    return out.masked_fill(~inside, FAR)


def log_likelihood(lp: torch.Tensor, targets, logit_lengths, target_lengths, blank: int) -> torch.Tensor:
    """log P(targets) (B,) for log-probabilities ``lp`` (B, T, U+1, V); -inf where T_b = 0."""
    B, T, U1, V = lp.shape
    N = T + U1 - 1  # diagonals: n = t + u for t < T, u <= U
    lab = targets.long().clamp(0, V - 1)  # (B, U): padding made a valid index, its values never used
    blank_lp = lp[..., blank]  # (B, T, U+1)
    label_lp = lp[:, :, :U1 - 1, :].gather(-1, lab[:, None, :, None].expand(B, T, U1 - 1, 1)).squeeze(-1)  # (B, T, U)
    blank_d = _skew(blank_lp, N)  # (B, N, U+1)
    label_d = _skew(label_lp, N)  # (B, N, U)
    alpha = F.pad(torch.zeros(B, 1, dtype=lp.dtype, device=lp.device), (0, U1 - 1), value=FAR)  # (B, U+1): n = 0
    diagonals = [alpha]
    for n in range(1, N):
        by_blank = alpha + blank_d[:, n - 1]  # from (t-1, u): (B, U+1)
        by_label = alpha[:, :-1] + label_d[:, n - 1]  # from (t, u-1): (B, U) for u = 1..U
        alpha = torch.cat([by_blank[:, :1], torch.logaddexp(by_blank[:, 1:], by_label)], dim=1)
        diagonals.append(alpha)
    alphas = torch.stack(diagonals, dim=1)  # (B, N, U+1)
    tl = logit_lengths.to(lp.device).long()
    ul = target_lengths.to(lp.device).long()
    last_t = (tl - 1).clamp(min=0)
    rows = torch.arange(B, device=lp.device)
    ll = alphas[rows, last_t + ul, ul] + blank_lp[rows, last_t, ul]
    return torch.where(tl > 0, ll, torch.full_like(ll, float("-inf")))


def rnnt_loss_reference(logits, targets, logit_lengths, target_lengths, blank: int = 0,
                        reduction: str = "none", fused_log_softmax: bool = True) -> torch.Tensor:
    """:func:`~speechperf.objectives.rnnt_loss.rnnt_loss` by autograd through plain torch operations."""
    check_inputs(logits, targets, logit_lengths, target_lengths, blank, reduction)
    work = logits.to(torch.promote_types(logits.dtype, torch.float32))  # float32 (float64 for float64)
    lp = F.log_softmax(work, dim=-1) if fused_log_softmax else work
    return reduce(-log_likelihood(lp, targets, logit_lengths, target_lengths, int(blank)), reduction)
