"""The process's random state: every generator a training step draws from, as plain values.

Below every stage: a checkpoint saves it (results/checkpoint.py) and local SGD gathers each
rank's own (speechperf/algorithms/local_sgd.py).
"""
from __future__ import annotations

import random

import numpy as np
import torch


def rng_state() -> dict:
    """What makes the next steps' numbers: every RNG state and the intra-op thread count, as
    tensors and plain values (what ``torch.load(weights_only=True)`` reads back)."""
    name, key, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {"torch": torch.get_rng_state(),
            # int64, not uint32: torch pickles a uint32 tensor that it cannot unpickle (plain pickle, as
            # local SGD's gather of every rank's state uses; torch.save is fine), measured on torch 2.13
            "numpy": {"name": name, "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
            "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "threads": torch.get_num_threads()}


def set_rng_state(state: dict) -> None:
    """Restore ``rng_state()``."""
    if state["threads"] != torch.get_num_threads():
        torch.set_num_threads(state["threads"])  # even above the cores now available: exact, only slower
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
