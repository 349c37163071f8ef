"""The wait for an epoch's first batch, at a preset's loader settings, four ways in one process
on the same features and planned batches:

- ``fresh, serial``: readers started when the epoch starts, each decompressing one shard at a
  time (the cold start of the serial readers);
- ``ahead, serial``: readers started ahead, during the previous epoch's evaluation
  (:meth:`speechperf.data.loader.Loader.start`, as the training loop does), one shard at a time
  (``threads=1``: the serial decompression, the reference);
- ``fresh`` and ``ahead``: the same with each reader's decompression threads as the loader picks
  them (:func:`speechperf.data.loader.reader_threads`: the idle readers' share).

A batch cut from a length-sorted window holds utterances of nearly every shard of the window,
so a reader's first batch waits for its whole window to be decompressed; with fewer windows
than readers (bucket_window 128 on a small corpus: one window) one reader did it alone.

The evaluation is stood in for by a sleep of ``--eval-s`` seconds (the conformer preset's
evaluation on an H200 took 0.6-0.9 s) during which the ahead readers start and fill their
prefetch buffer; what is timed is the training loop's wait from asking for the epoch's first
batch to having it. Each epoch's batches are then read to the end, or its first ``--batches``
(every mode reads the same batches, checked by their ids). Median and spread over ``--repeats``
epochs per mode, the modes interleaved so that the machine's other load falls on all alike; the
load average is printed.

Usage: python benchmarks/bench_epoch_start.py FEATS [--preset conformer] [--set loader.readers=2 ...]
       [--eval-s 0.8] [--repeats 3] [--batches 0] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from speechperf.config import load_preset
from speechperf.data.loader import load_index, make_loader
from speechperf.errors import SpeechperfError

# mode -> (readers started ahead, decompression threads per reader: None = the loader's choice)
MODES = {"fresh, serial": (False, 1), "ahead, serial": (True, 1), "fresh": (False, None), "ahead": (True, None)}
REFERENCE = "ahead, serial"


def train_splits(feats: Path) -> list[str]:
    return sorted(p.name for p in feats.iterdir() if p.name.startswith("train") and (p / "index.json").exists())


def first_batch_wait(feats: Path, splits, cfg, index, epoch: int, ahead: bool, threads, eval_s: float, batches: int):
    """(seconds from asking for the epoch's first batch to having it, the ids of the epoch's first
    ``batches`` batches, 0: all; the readers of the rest stopped)."""
    loader = make_loader(feats, splits, cfg, epoch=epoch, seed=1, index=index, threads=threads)
    if ahead:
        loader.start()
    time.sleep(eval_s)  # the previous epoch's evaluation
    it = iter(loader)
    t0 = time.perf_counter()
    first = next(it)
    wait = time.perf_counter() - t0
    ids = [first.ids] + [b.ids for _, b in zip(range(batches - 1 if batches else len(loader)), it)]
    it.close()  # the readers of the batches not read stop with it
    return wait, ids


def window_facts(feats: Path, splits, cfg, index) -> dict:
    """What the first batch of epoch 2 needs: its shards, the plan's windows and readers in use."""
    loader = make_loader(feats, splits, cfg, epoch=2, seed=1, index=index)
    plan = loader.plan
    return {"shards": len(index.keys), "first_batch_shards": len(set(index.shard[plan.batches[0]].tolist())),
            "first_batch_utts": len(plan.batches[0]), "batches": len(plan), "windows": len(set(plan.groups.tolist())),
            "readers_in_use": loader.readers_in_use(), "threads": loader.reader_threads()}


def measure(a, cfg, splits, index) -> dict:
    waits = {mode: [] for mode in MODES}
    for r in range(a.repeats):
        ids = {}
        for mode, (ahead, threads) in MODES.items():
            wait, ids[mode] = first_batch_wait(a.feats, splits, cfg, index, 2 + r, ahead, threads, a.eval_s, a.batches)
            waits[mode].append(wait)
        if len({tuple(map(tuple, v)) for v in ids.values()}) != 1:
            raise SystemExit(f"epoch {2 + r}: the modes' batches differ ({', '.join(MODES)})")
    return {mode: {"median_s": statistics.median(w), "min_s": min(w), "max_s": max(w)} for mode, w in waits.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("feats", type=Path)
    p.add_argument("--preset", default="conformer")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a preset override (repeatable)")
    p.add_argument("--eval-s", type=float, default=0.8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batches", type=int, default=0, help="batches read (and compared) per epoch; 0: all")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    try:
        cfg = load_preset(a.preset, a.set).loader
        splits = train_splits(a.feats) if a.feats.is_dir() else []
        if not splits:
            raise SpeechperfError(f"{a.feats}: no prepared train* split")
        index = load_index(a.feats, splits)
    except SpeechperfError as e:
        print(f"error: {e}")
        raise SystemExit(2) from None
    load_before = os.getloadavg()[0]
    row = measure(a, cfg, splits, index)
    ref = row[REFERENCE]["median_s"]
    row.update(preset=a.preset, overrides=a.set, readers=cfg.readers, max_duration=cfg.max_duration,
               bucket_window=cfg.bucket_window, eval_s=a.eval_s, repeats=a.repeats, batches_read=a.batches,
               reference=REFERENCE,
               load_1min=[load_before, os.getloadavg()[0]], cores=os.cpu_count(),
               **window_facts(a.feats, splits, cfg, index),
               ratio_reference_over_ahead=ref / max(row["ahead"]["median_s"], 1e-9),
               ratio_fresh_serial_over_ahead=row["fresh, serial"]["median_s"] / max(row["ahead"]["median_s"], 1e-9))
    if a.json:
        print(json.dumps(row, indent=1))
        return
    print(f"preset {a.preset} {' '.join(a.set)}: {cfg.readers} readers ({row['readers_in_use']} in use, "
          f"{row['threads']} decompression threads each), max_duration {cfg.max_duration:g}, bucket_window "
          f"{cfg.bucket_window}; {row['batches']} batches in {row['windows']} window(s); the first batch: "
          f"{row['first_batch_utts']} utterances from {row['first_batch_shards']} of {row['shards']} shards")
    print(f"evaluation stand-in {a.eval_s} s, {a.repeats} epochs per mode; {row['cores']} cores, load average "
          f"{load_before:.2f} before, {row['load_1min'][1]:.2f} after")
    for mode in MODES:
        m = row[mode]
        print(f"  {mode:14s} first-batch wait: median {m['median_s']:.3f} s "
              f"(min {m['min_s']:.3f}, max {m['max_s']:.3f})")
    print(f"  {REFERENCE} (reference) / ahead: {row['ratio_reference_over_ahead']:.2f}x; "
          f"fresh, serial / ahead: {row['ratio_fresh_serial_over_ahead']:.2f}x")


if __name__ == "__main__":
    main()
