"""Greedy (best path) CTC decoding: argmax per frame, merge repeats, drop blanks."""
from __future__ import annotations

import numpy as np

from speechperf.data import alphabet
from speechperf.decode import register_decoder


class GreedyDecoder:
    """Beam width 1: the most likely symbol of every frame."""

    name = "greedy"

    def decode(self, log_probs: np.ndarray) -> str:
        """(T, C) log-probabilities -> text."""
        if log_probs.ndim != 2 or log_probs.shape[1] != alphabet.NUM_SYMBOLS:
            raise ValueError(f"expected (T, {alphabet.NUM_SYMBOLS}) log-probabilities, got {log_probs.shape}")
        return alphabet.decode(alphabet.collapse(log_probs.argmax(axis=1)))

    def decode_batch(self, log_probs: np.ndarray, lens, workers: int = 0) -> list[str]:
        """(T, B, C) with valid lengths (B,) -> B texts (argmax is cheap: no worker processes)."""
        best = log_probs.argmax(axis=2)  # (T, B)
        return [alphabet.decode(alphabet.collapse(best[: int(n), b])) for b, n in enumerate(lens)]


@register_decoder("greedy")
def make_greedy(beam: int = 1, features=None, **kw) -> GreedyDecoder:
    return GreedyDecoder()
