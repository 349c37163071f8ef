"""The wait for an epoch's first batch: readers started when the epoch starts (the reference,
``fresh``) against readers started ahead, during the previous epoch's evaluation (``ahead``:
:meth:`speechperf.data.loader.Loader.start`, as the training loop does), in the same process
on the same features and planned batches.

The evaluation is stood in for by a sleep of ``--eval-s`` seconds (the demo's per-epoch
evaluation on an H200 took 1.7-2.3 s) during which the ahead readers start and fill their
prefetch buffer; what is timed is the training loop's wait from asking for the epoch's first
batch to having it. Each epoch's batches are then read to the end (both modes read the same
batches, checked by their ids). Median and spread over ``--repeats`` epochs per mode.

Usage: python benchmarks/bench_epoch_start.py FEATS [--preset gpu] [--readers R] [--eval-s 2] [--repeats 3] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from speechperf.config import load_preset
from speechperf.data.loader import load_index, make_loader


def train_splits(feats: Path) -> list[str]:
    return sorted(p.name for p in feats.iterdir() if p.name.startswith("train") and (p / "index.json").exists())


def first_batch_wait(feats: Path, splits, cfg, index, epoch: int, ahead: bool, eval_s: float) -> tuple[float, list]:
    """(seconds from asking for the epoch's first batch to having it, the epoch's batch ids)."""
    loader = make_loader(feats, splits, cfg, epoch=epoch, seed=1, index=index)
    if ahead:
        loader.start()
    time.sleep(eval_s)  # the previous epoch's evaluation
    it = iter(loader)
    t0 = time.perf_counter()
    first = next(it)
    wait = time.perf_counter() - t0
    return wait, [first.ids] + [b.ids for b in it]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("feats", type=Path)
    p.add_argument("--preset", default="gpu")
    p.add_argument("--eval-s", type=float, default=2.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--readers", type=int, help="the preset's loader.readers otherwise")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    cfg = load_preset(a.preset, [f"loader.readers={a.readers}"] if a.readers is not None else []).loader
    splits = train_splits(a.feats)
    index = load_index(a.feats, splits)
    waits = {"fresh": [], "ahead": []}
    for r in range(a.repeats):  # modes interleaved: the machine's other load falls on both alike
        ids = {}
        for mode in ("fresh", "ahead"):
            wait, ids[mode] = first_batch_wait(a.feats, splits, cfg, index, 2 + r, mode == "ahead", a.eval_s)
            waits[mode].append(wait)
        if ids["fresh"] != ids["ahead"]:
            raise SystemExit(f"epoch {2 + r}: the ahead loader's batches differ from the fresh one's")
    row = {mode: {"median_s": statistics.median(w), "min_s": min(w), "max_s": max(w)} for mode, w in waits.items()}
    row.update(preset=a.preset, readers=cfg.readers, eval_s=a.eval_s, repeats=a.repeats,
               ratio_fresh_over_ahead=row["fresh"]["median_s"] / max(row["ahead"]["median_s"], 1e-9))
    if a.json:
        print(json.dumps(row, indent=1))
        return
    print(f"preset {a.preset}: {cfg.readers} readers, evaluation stand-in {a.eval_s} s, {a.repeats} epochs per mode")
    for mode in ("fresh", "ahead"):
        m = row[mode]
        print(f"  {mode:5s} first-batch wait: median {m['median_s']:.3f} s (min {m['min_s']:.3f}, max {m['max_s']:.3f})")
    print(f"  fresh / ahead: {row['ratio_fresh_over_ahead']:.1f}x")


if __name__ == "__main__":
    main()
