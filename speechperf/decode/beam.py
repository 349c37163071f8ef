"""CTC prefix beam search without a language model.

Every beam is a label prefix with two probabilities: of the paths that end in a blank and
of those that end in its last label (needed because a repeated label only counts twice
when a blank separates the two). Log domain throughout. Per frame, symbols whose
probability is below ``prune`` are not tried as extensions (a path through them cannot
rise into the beam); ``prune=0`` tries every symbol, and with a beam wider than the number
of prefixes the search is exact (tested against exhaustive enumeration).
"""
from __future__ import annotations

import heapq
import math

import numpy as np

from speechperf.data import alphabet
from speechperf.decode import register_decoder
from speechperf.decode.batch import decode_parallel

NEG_INF = -math.inf


def logsumexp(a: float, b: float) -> float:
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    m = max(a, b)
    return m + math.log1p(math.exp(-abs(a - b)))


def prefix_beam_search(log_probs: np.ndarray, beam: int, blank: int = 0, prune: float = 1e-3) -> tuple[int, ...]:
    """(T, C) log-probabilities -> the most probable label sequence (a tuple)."""
    log_prune = math.log(prune) if prune > 0 else NEG_INF
    lse = logsumexp
    beams: dict[tuple[int, ...], tuple[float, float]] = {(): (0.0, NEG_INF)}  # prefix -> (p_blank, p_label)
    for frame_np in log_probs:
        frame = frame_np.tolist()  # Python floats: indexing a list is ~10x faster than numpy scalars
        p_blank = frame[blank]
        candidates = [(c, frame[c]) for c in np.flatnonzero(frame_np >= log_prune).tolist() if c != blank]
        nxt: dict[tuple[int, ...], list[float]] = {}
        for prefix, (pb, pnb) in beams.items():
            total = lse(pb, pnb)
            entry = nxt.get(prefix)
            if entry is None:
                entry = nxt[prefix] = [NEG_INF, NEG_INF]
            entry[0] = lse(entry[0], total + p_blank)
            last = prefix[-1] if prefix else -1
            if last >= 0:  # the last label continues without a new label
                entry[1] = lse(entry[1], pnb + frame[last])
            for c, p in candidates:
                key = prefix + (c,)
                ext = nxt.get(key)
                if ext is None:
                    ext = nxt[key] = [NEG_INF, NEG_INF]
                # after the same label, only a blank-ended path may start a new one
                ext[1] = lse(ext[1], (pb if c == last else total) + p)
        if len(nxt) > beam:
            ranked = heapq.nlargest(beam, nxt.items(), key=lambda kv: lse(kv[1][0], kv[1][1]))
        else:
            ranked = nxt.items()
        beams = {k: (v[0], v[1]) for k, v in ranked}
    return max(beams.items(), key=lambda kv: logsumexp(*kv[1]))[0]


class BeamDecoder:
    """Prefix beam search over the 30-symbol alphabet."""

    name = "beam"

    def __init__(self, beam: int, prune: float = 1e-3):
        self.beam, self.prune = beam, prune

    def decode(self, log_probs: np.ndarray) -> str:
        if log_probs.shape[0] == 0:
            return ""
        return alphabet.decode(prefix_beam_search(log_probs, self.beam, prune=self.prune))

    def decode_batch(self, log_probs: np.ndarray, lens, workers: int = 0) -> list[str]:
        return decode_parallel(self, log_probs, lens, workers)


@register_decoder("beam")
def make_beam(beam: int = 16, features=None, prune: float = 1e-3, **kw):
    if beam == 1:
        from speechperf.decode.greedy import GreedyDecoder

        return GreedyDecoder()
    return BeamDecoder(beam, prune)
