"""The TDT loss in plain torch operations, differentiated by autograd: the kernels' reference in the
tests and the benchmark's. Same signature and semantics as
:func:`speechperf.objectives.tdt_loss.tdt_loss` (its docstring), without its memory economy.

The forward variables go frame by frame: alpha at frame t takes the arcs of durations d >= 1 from
frames t - d (batch-wide over (B, U+1)), then the labels of duration 0 inside frame t, a linear
recursion along u solved at once: with w[j] the log-weight of the d=0 label arc from (t, j) and
C[u] = w[0] + ... + w[u-1], alpha[t, u] = C[u] + logcumsumexp_k(a[k] - C[k]) over k <= u, where a
holds the arcs from earlier frames (and the start). So T steps of a few batch-wide operations each.
No path is a large finite negative number (FAR), not -inf, so that no NaN reaches the gradient.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from speechperf.objectives.rnnt_loss import reduce
from speechperf.objectives.tdt_loss import check_inputs

FAR = -1e30


def _arcs(lp_tok, lpd, targets, blank: int, sigma: float):
    """(blank, label) log-weights per node and duration: (B, T, U+1, D) and (B, T, U, D)."""
    B, T, U1, V = lp_tok.shape
    lab = targets.long().clamp(0, V - 1)  # (B, U): padding made a valid index, its values never used
    blank_lp = lp_tok[..., blank] - sigma  # (B, T, U+1)
    label_lp = lp_tok[:, :, : U1 - 1].gather(-1, lab[:, None, :, None].expand(B, T, U1 - 1, 1))[..., 0] - sigma
    return blank_lp[..., None] + lpd, label_lp[..., None] + lpd[:, :, : U1 - 1]


def log_likelihood(lp_tok, lpd, targets, logit_lengths, target_lengths, durations, blank: int,
                   sigma: float = 0.0) -> torch.Tensor:
    """log P(targets) (B,) from token log-probabilities (B, T, U+1, V) and duration ones (B, T, U+1, D)."""
    B, T, U1, _ = lp_tok.shape
    blank_w, label_w = _arcs(lp_tok, lpd, targets, blank, sigma)
    # per frame and duration (B, U+1) / (B, U) views by unbind, whose backward is one stack (an index per
    # step would have autograd write a zero tensor of the whole lattice for each)
    blank_f = [w.unbind(-1) for w in blank_w.unbind(1)]
    label_f = [w.unbind(-1) for w in label_w.unbind(1)]
    dev, dt = lp_tok.device, lp_tok.dtype
    start = F.pad(torch.zeros(B, 1, dtype=dt, device=dev), (0, U1 - 1), value=FAR)  # (B, U+1): (0, 0) only
    alphas = []
    for t in range(T):
        terms = [start] if t == 0 else []
        for k, d in enumerate(durations):
            s = t - d
            if d == 0 or s < 0:
                continue
            terms.append(alphas[s] + blank_f[s][k])  # blank from (s, u)
            terms.append(F.pad(alphas[s][:, :-1] + label_f[s][k], (1, 0), value=FAR))  # label from (s, u-1)
        a = torch.logsumexp(torch.stack(terms), 0) if terms else torch.full((B, U1), FAR, dtype=dt, device=dev)
        if 0 in durations:
            w = label_f[t][durations.index(0)]  # (B, U): the d=0 label arc from (t, j)
            c = F.pad(torch.cumsum(w, 1), (1, 0))  # (B, U+1): C[u]
            a = c + torch.logcumsumexp(a - c, 1)
        alphas.append(a.clamp(min=FAR))
    alpha = torch.stack(alphas, 1)  # (B, T, U+1)
    tl = logit_lengths.to(dev).long()
    ul = target_lengths.to(dev).long()
    rows = torch.arange(B, device=dev)
    finals = []
    for k, d in enumerate(durations):
        s = (tl - d).clamp(0, T - 1)
        ok = (d > 0) & (tl - d >= 0)
        term = alpha[rows, s, ul] + blank_w[rows, s, ul, k]
        finals.append(torch.where(torch.as_tensor(ok, device=dev), term, torch.full_like(term, FAR)))
    ll = torch.logsumexp(torch.stack(finals), 0)
    return torch.where(ll > FAR / 2, ll, torch.full_like(ll, float("-inf")))


def tdt_loss_reference(logits, targets, logit_lengths, target_lengths, durations, blank: int = 0,
                       reduction: str = "none", fused_log_softmax: bool = True, sigma: float = 0.0) -> torch.Tensor:
    """:func:`~speechperf.objectives.tdt_loss.tdt_loss` by autograd through plain torch operations."""
    ds = check_inputs(logits, targets, logit_lengths, target_lengths, durations, blank, reduction)
    work = logits.to(torch.promote_types(logits.dtype, torch.float32))
    tok, dur = work[..., : work.shape[-1] - len(ds)], work[..., work.shape[-1] - len(ds):]
    if fused_log_softmax:
        tok, dur = F.log_softmax(tok, -1), F.log_softmax(dur, -1)
    ll = log_likelihood(tok, dur, targets, logit_lengths, target_lengths, list(ds), int(blank), float(sigma))
    return reduce(-ll, reduction)
