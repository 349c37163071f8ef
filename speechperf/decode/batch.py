"""Decoding a batch in parallel over CPU processes (evaluation is dominated by decoding)."""
from __future__ import annotations

import multiprocessing as mp

import numpy as np


def _decode_one(args) -> str:
    decoder, lp = args
    return decoder.decode(lp)


def decode_parallel(decoder, log_probs: np.ndarray, lens, workers: int = 0) -> list[str]:
    """(T, B, C) log-probs with valid lengths (B,) -> texts; ``workers`` > 1 uses processes."""
    items = [np.ascontiguousarray(log_probs[: int(n), b]) for b, n in enumerate(lens)]  # (T_b, C) each
    if workers <= 1 or len(items) < 2:
        return [decoder.decode(lp) for lp in items]
    with mp.get_context("fork").Pool(min(workers, len(items))) as pool:
        return pool.map(_decode_one, [(decoder, lp) for lp in items], chunksize=max(1, len(items) // (4 * workers)))
