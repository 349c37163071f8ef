"""``FEATS/stats.json``: the per-dimension mean and std every run on a features folder is
normalized with, and the rules that keep it fixed.

A run's weights only mean something under the normalization they were trained with: a
statistics file that changed under a run (a repair that recomputed it from one split, say)
made a resumed run train on two normalizations without a word. So:

- ``stats.json`` records the training splits it was computed over (``splits``); ``prepare``
  writes it once, over every prepared training split, and never changes it afterwards: a
  repair or rebuild of any split keeps it byte for byte;
- a ``prepare`` that adds a training split the statistics were not computed over is refused
  by name before any work, unless ``--recompute-stats`` asks for new statistics (over every
  prepared training split);
- a run records the sha256 of the ``stats.json`` it trained on (``run.json``'s data
  section), and continuing it, or evaluating its checkpoint, on other statistics is refused,
  naming the file and both hashes.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from speechperf.errors import SpeechperfError
from speechperf.features.shards import load_index, write_json

STATS_FILE = "stats.json"
RECOMPUTE_FLAG = "--recompute-stats"


class StatsError(SpeechperfError):
    """stats.json would change under the runs that use it, or is not the one a run trained on."""


def stats_sha256(feats: Path) -> str | None:
    """The sha256 of ``FEATS/stats.json`` (None: there is none)."""
    path = Path(feats) / STATS_FILE
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def read_stats(feats: Path) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std), each (D,) float32, of ``FEATS/stats.json``; a missing or damaged file is
    refused by name (a run verifies it before its folder and clock exist)."""
    path = Path(feats) / STATS_FILE
    if not path.exists():
        raise StatsError(f"{path} is missing (prepare a train-* split first, or set loader.normalize=false)")
    try:
        s = json.loads(path.read_text())
        mean, std = np.asarray(s["mean"], dtype=np.float32), np.asarray(s["std"], dtype=np.float32)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise StatsError(f"{path} cannot be read ({type(e).__name__}: {e}); recompute it with speechperf prepare "
                         f"... {RECOMPUTE_FLAG}") from e
    if mean.ndim != 1 or mean.shape != std.shape or not (np.isfinite(mean).all() and np.isfinite(std).all()) \
            or (std <= 0).any():
        raise StatsError(f"{path}: mean and std must be finite lists of one length with std > 0 (mean "
                         f"{mean.shape}, std {std.shape}); recompute it with speechperf prepare ... {RECOMPUTE_FLAG}")
    return mean, std


def recorded_splits(feats: Path) -> list[str] | None:
    """The training splits ``FEATS/stats.json`` was computed over; None when there is no file."""
    path = Path(feats) / STATS_FILE
    if not path.exists():
        return None
    try:
        splits = json.loads(path.read_text()).get("splits")
    except (OSError, ValueError, AttributeError) as e:
        raise StatsError(f"{path} cannot be read ({e}); recompute it with speechperf prepare ... "
                         f"{RECOMPUTE_FLAG} (runs trained on the old statistics will not continue)") from e
    if not isinstance(splits, list):
        raise StatsError(f"{path} does not record the splits it was computed over; recompute it with speechperf "
                         f"prepare ... {RECOMPUTE_FLAG} (runs trained on the old statistics will not continue)")
    return splits


def refuse_change(feats: Path, train_splits: list[str], recompute: bool) -> None:
    """Before ``prepare`` works: refuse training splits outside the recorded statistics'
    (preparing them would change the statistics, or leave them computed over other data)."""
    if recompute:
        return
    recorded = recorded_splits(feats)
    new = [s for s in train_splits if recorded is not None and s not in recorded]
    if new:
        raise StatsError(f"{Path(feats) / STATS_FILE} was computed over {', '.join(recorded) or 'no split'}; "
                         f"{', '.join(new)} is a training split outside them and every run on {feats} is normalized "
                         f"with these statistics: prepare it into a new folder, or pass {RECOMPUTE_FLAG} to compute "
                         "them again over every training split (runs trained on the current ones will not continue)")


def write_stats(feats: Path, train_splits: list[str], recompute: bool, sums: dict | None = None) -> None:
    """Compute ``stats.json`` over ``train_splits`` (every prepared training split) where there
    is none, or where ``recompute`` asks; an existing file is otherwise kept as it is.
    ``sums``: split -> its index's "sums", where the caller has them (not reading a 960 h
    index back into memory); the other splits' are read from their index."""
    feats = Path(feats)
    path = feats / STATS_FILE
    if path.exists() and not recompute:
        return
    sums = sums or {}
    parts = [sums[s] if s in sums else load_index(feats / s)["sums"] for s in train_splits]
    parts = [p for p in parts if p]
    if not parts:
        return
    n = sum(p["n"] for p in parts)
    mean = np.sum([p["sum"] for p in parts], 0) / n
    std = np.sqrt(np.maximum(np.sum([p["sumsq"] for p in parts], 0) / n - mean**2, 1e-8))
    before = stats_sha256(feats)
    write_json(path, {"splits": list(train_splits), "frames": n, "mean": mean.tolist(), "std": std.tolist()})
    after = stats_sha256(feats)
    if before is not None and before != after:
        print(f"prepare: {path} recomputed over {', '.join(train_splits)} (sha256 {before[:12]} -> {after[:12]}); "
              "runs trained on the previous statistics will not continue", file=sys.stderr)


def check_trained_on(feats: Path, recorded: str | None, run: Path) -> None:
    """Refuse ``FEATS/stats.json`` when it is not the one ``run`` recorded (None: the
    run recorded none, nothing to compare)."""
    if recorded is None:
        return
    now = stats_sha256(feats)
    if now != recorded:
        raise StatsError(f"{Path(feats) / STATS_FILE} is not the statistics run {run} trained on (sha256 {recorded} "
                         f"recorded, {now or 'no file'} now): its normalization changed; restore that file, give "
                         "--data a features folder with it, or train a new run with another --out")
