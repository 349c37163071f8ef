"""Greedy (best path) CTC decoding: argmax per frame, merge repeats, drop blanks."""
from __future__ import annotations

import numpy as np

from speechperf.data.units import CHAR_UNITS, Units
from speechperf.decode import DecodeError, check_log_probs, register_decoder


class GreedyDecoder:
    """Beam width 1: the most likely symbol of every frame, read back in ``units`` (characters by default)."""

    name = "greedy"
    batched = True  # a decode pool hands it whole batches: one vectorized argmax beats a task per utterance

    def __init__(self, units: Units = CHAR_UNITS):
        self.units = units

    def decode(self, log_probs: np.ndarray) -> str:
        """(T, C) log-probabilities -> text."""
        check_log_probs(log_probs, self.units.num_classes)
        return self.units.decode(self.units.collapse(log_probs.argmax(axis=1)))

    def decode_batch(self, log_probs: np.ndarray, lens, workers: int = 0) -> list[str]:
        """(T, B, C) with valid lengths (B,) -> B texts (argmax is cheap: no threads)."""
        classes = self.units.num_classes
        if log_probs.ndim != 3 or log_probs.shape[2] != classes or len(lens) != log_probs.shape[1]:
            raise DecodeError(f"expected (T, B, {classes}) log-probs with B lengths, got {log_probs.shape}, "
                              f"{len(lens)}")
        best = log_probs.argmax(axis=2)  # (T, B)
        return [self.units.decode(self.units.collapse(best[: int(n), b])) for b, n in enumerate(lens)]


@register_decoder("greedy")
def make_greedy(beam: int = 1, units: Units = CHAR_UNITS, **kw) -> GreedyDecoder:
    return GreedyDecoder(units)
