"""The TDT's beam search (Token-and-Duration Transducer, Xu et al. 2023): the final evaluation's
search of a transducer with ``model.durations``, scoring exactly the paths the TDT loss sums
(``objectives/tdt_reference.py``).

A hypothesis is a token sequence at a frame. From frame t each candidate is a unit and a duration
d, its log-weight the token's log-probability plus the duration's (the joint's two log-softmaxes):
a label moves to frame t + d with the label appended (d = 0 stays at t: at most ``max_symbols``
labels at one frame, NeMo's cap), a blank moves to t + d with d >= 1. A move must land inside the
utterance (t + d < T), except a blank that lands exactly on T: that ends the hypothesis (the
loss's final arc). Candidates that are one sequence at one frame, reached by different paths, are
one hypothesis with their probabilities log-added (its labels at the frame: the fewest of its
paths'), so with a beam wide enough to keep every
hypothesis a final score is log P(tokens) over every alignment. Each step keeps the best
``beam`` candidates over every frame (the frames of a step's hypotheses differ, as in
``transducer_search.py``'s ALSD); every move adds a frame or a label (the cap bounds labels per
frame), so the search ends. One utterance at a time: its hypotheses share each joint and
prediction call; the host reads the step's scores once per step.
"""
from __future__ import annotations

import math

import torch

from speechperf.objectives.transducer_search import BLANK, Hypothesis, _advance, _logadd, _merge_finals


def _moves(model, enc: torch.Tensor, hyps: list[Hypothesis], g: torch.Tensor, durations: tuple[int, ...],
           max_symbols: int, beam: int) -> dict[tuple[tuple[int, ...], int], tuple[float, int, int, int]]:
    """The best allowed moves of ``hyps``, merged: (tokens, frame) -> (log-prob, parent row, unit,
    labels at that frame); frame T (``enc``'s length) marks an ended hypothesis. The moves are scored
    at once (K, V, D); the best ``beam`` x (D + 1) of them are merged (a margin for moves that merge,
    so that about ``beam`` distinct ones remain), and a beam wider than the moves merges every path."""
    frames, V = enc.shape[0], model.cfg.num_classes
    at = torch.tensor([h.frame for h in hyps])
    logits = model.joint(enc.index_select(0, at.to(enc.device)), g).float()  # (K, V + D)
    tok, dur = logits[:, :V].log_softmax(-1).cpu(), logits[:, V:].log_softmax(-1).cpu()  # (K, V), (K, D)
    d = torch.tensor(durations)
    end = at[:, None] + d[None, :]  # (K, D): the frame each duration lands on
    base = torch.tensor([h.score for h in hyps])
    scores = base[:, None, None] + tok[:, :, None] + dur[:, None, :]  # (K, V, D)
    full = torch.tensor([h.symbols >= max_symbols for h in hyps])[:, None]  # (K, 1): no label may stay
    label_ok = (end < frames) & ((d > 0)[None, :] | ~full)  # (K, D)
    blank_ok = (end <= frames) & (d > 0)[None, :]  # (K, D): a blank moves, and may end on T exactly
    ok = label_ok[:, None, :].expand(-1, V, -1).clone()
    ok[:, BLANK] = blank_ok
    flat = scores.masked_fill(~ok, -math.inf).flatten()
    top = flat.topk(min(int(ok.sum()), beam * (len(durations) + 1)))
    moves: dict = {}
    for i, score in zip(top.indices.tolist(), top.values.tolist()):
        k, rest = divmod(i, V * len(durations))
        v, j = divmod(rest, len(durations))
        h, step = hyps[k], durations[j]
        key = (h.tokens + ((v,) if v != BLANK else ()), h.frame + step)
        symbols = h.symbols + 1 if step == 0 else 0  # d = 0 is a label's (a blank's is not allowed)
        old = moves.get(key)
        # merged paths: the fewest labels at the frame (the cap binds the merged hypothesis least)
        moves[key] = (score, k, v, symbols) if old is None else (
            _logadd(old[0], score), old[1], old[2], min(old[3], symbols))
    return moves


def tdt_beam_hypotheses(model, enc: torch.Tensor, durations, beam: int = 4,
                        max_symbols: int = 5) -> list[Hypothesis]:
    """The ended hypotheses of one utterance's encoder output ``enc`` (T', J), its valid frames only,
    best first (one per token sequence, its alignments' probabilities log-added)."""
    frames, device, durations = enc.shape[0], enc.device, tuple(durations)
    if frames == 0:
        return []
    g, state = model.predict_step(torch.full((1,), BLANK, dtype=torch.long, device=device), None)  # (1, J)
    active, finals = [Hypothesis((), 0.0, 0)], {}
    while active:
        moves = _moves(model, enc, active, g, durations, max_symbols, beam)
        picked = sorted(moves.items(), key=lambda m: -m[1][0])[:beam]
        picks = [(Hypothesis(tokens, score, frame, symbols), k, v)
                 for (tokens, frame), (score, k, v, symbols) in picked]
        ended, active, g, state = _advance(model, picks, g, state, frames)
        _merge_finals(finals, ended)
    return sorted(finals.values(), key=lambda h: -h.score)


def tdt_beam_search(model, enc: torch.Tensor, durations, beam: int = 4, max_symbols: int = 5) -> list[int]:
    """The best token sequence (no blanks) of one utterance's encoder output ``enc`` (T', J)."""
    hyps = tdt_beam_hypotheses(model, enc, durations, beam, max_symbols)
    return list(hyps[0].tokens) if hyps else []

