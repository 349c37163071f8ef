"""Decoding a batch in parallel over CPU processes (evaluation is dominated by decoding).

The decoder is handed to the workers by fork inheritance (a module global set before the
pool starts), not pickled with every task: a word beam decoder carries its dictionary and
LM tables, and only the (T_b, C) matrices travel.
"""
from __future__ import annotations

import multiprocessing as mp

import numpy as np
from speechperf.decode import DecodeError

_DECODER = None  # the decoder the forked workers use


def _decode_one(lp: np.ndarray) -> str:
    return _DECODER.decode(lp)


def decode_parallel(decoder, log_probs: np.ndarray, lens, workers: int = 0) -> list[str]:
    """(T, B, C) log-probs with valid lengths (B,) -> texts; ``workers`` > 1 uses processes."""
    global _DECODER
    if log_probs.ndim != 3 or len(lens) != log_probs.shape[1]:
        raise DecodeError(f"expected (T, B, C) log-probs with B lengths, got {log_probs.shape} and {len(lens)}")
    items = [np.ascontiguousarray(log_probs[: int(n), b]) for b, n in enumerate(lens)]  # (T_b, C) each
    if workers <= 1 or len(items) < 2:
        return [decoder.decode(lp) for lp in items]
    _DECODER = decoder
    try:
        with mp.get_context("fork").Pool(min(workers, len(items))) as pool:
            return pool.map(_decode_one, items, chunksize=max(1, len(items) // (4 * workers)))
    finally:
        _DECODER = None
