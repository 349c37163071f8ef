"""CTC prefix beam search without a language model (the compiled kernel, unconstrained).

Per frame, symbols whose probability is below ``prune`` are not tried as extensions (a
path through them cannot rise into the beam); ``prune=0`` tries every symbol, and with a
beam wider than the number of prefixes the search is exact (tested against exhaustive
enumeration on small alphabets).
"""
from __future__ import annotations

import math

import numpy as np

from speechperf.corpus import alphabet
from speechperf.decode import check_log_probs, register_decoder
from speechperf.decode.batch import decode_parallel
from speechperf.decode.kernel import MODE_WORDS, beam_search
from speechperf.decode.greedy import GreedyDecoder

# Prefixes this far (natural log) below the best of a frame are dropped: pyctcdecode drops
# at 10 and flashlight at 25; 20 lost no accuracy against an unbounded gap in the benchmark.
GAP = 20.0
# Symbols below this probability in a frame are not tried (pyctcdecode: exp(-5) = 6.7e-3).
# Measured at width 256 on 8 benchmark utterances: 5e-3 took 3.7 ms (peaked) / 40 ms
# (noisy) per utterance against 8.2 / 58 ms at 1e-3, CER 0.00 / 34.6 against 0.00 / 34.4.
PRUNE = 5e-3
_EMPTY_F = np.zeros(1, np.float64)
_EMPTY_I32 = np.zeros(1, np.int32)
_EMPTY_I64 = np.zeros(2, np.int64)


def prefix_beam_search(log_probs: np.ndarray, beam: int, prune: float = PRUNE, gap: float = GAP,
                       space: int = -1) -> tuple[int, ...]:
    """(T, C) log-probabilities, blank = 0, any C -> the most probable label sequence.

    ``prune``: symbols below this probability in a frame are not tried; ``gap``: prefixes
    more than this (natural log) below the frame's best are dropped. 0 and inf: exact.
    ``space``: a label whose leading and repeated occurrences make no new prefix (the
    search is then over texts with single spaces); -1: every label sequence is its own.
    """
    lp = np.ascontiguousarray(log_probs, dtype=np.float64)  # (T, C)
    C = lp.shape[1]
    labels, _ = beam_search(lp, beam, math.log(prune) if prune > 0 else -np.inf, gap, False, MODE_WORDS, 0.0, 1, space,
                            np.zeros((1, C), np.int32), _EMPTY_I32, _EMPTY_I32, _EMPTY_I32,
                            np.zeros(C, np.bool_), _EMPTY_F, _EMPTY_F, _EMPTY_I64, _EMPTY_I32, _EMPTY_F,
                            _EMPTY_F, _EMPTY_F)
    return tuple(labels.tolist())


class BeamDecoder:
    """Prefix beam search over the 30-symbol alphabet."""

    name = "beam"

    def __init__(self, beam: int, prune: float = PRUNE, gap: float = GAP):
        self.beam, self.prune, self.gap = beam, prune, gap

    def decode(self, log_probs: np.ndarray) -> str:
        """(T, 30) log-probabilities -> text ("" for T = 0 or all-blank frames), white space
        collapsed as in normalized transcripts (a doubled space is no word)."""
        check_log_probs(log_probs)
        if log_probs.shape[0] == 0:
            return ""
        best = prefix_beam_search(log_probs, self.beam, self.prune, self.gap, alphabet.SPACE)
        return " ".join(alphabet.decode(best).split())

    def decode_batch(self, log_probs: np.ndarray, lens, workers: int = 0) -> list[str]:
        """(T, B, 30) with valid lengths (B,) -> B texts; ``workers`` > 1 decodes on that many threads."""
        return decode_parallel(self, log_probs, lens, workers)


@register_decoder("beam")
def make_beam(beam: int = 16, prune: float = PRUNE, gap: float = GAP, **kw):
    """Beam width 1 is greedy (one prefix kept per frame is the best path)."""
    if beam == 1:
        return GreedyDecoder()
    return BeamDecoder(beam, prune, gap)
