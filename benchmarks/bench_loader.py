"""The loader's supply and its decompression over an epoch, on prepared features.

For each reader count R: the audio seconds and utterances per second delivered to the training
process (after decompression, normalization, padding and the hand-over between processes; the
first batch, start-up, not counted), per reader; then one whole epoch's shards decompressed,
counted: bytes decompressed over the bytes of the distinct shards' contents, the reference
counted in the same epoch. Goals (docs/data.md): decompressed / contents <= 1.05, >= 2,700 audio
s/s delivered per reader (one H100's appetite for the paper preset: 8 H100s need
8 x 2,700). The audio one reader builds per CPU second of its own, in process, is beside them: a
figure a busy machine skews far less than wall-clock rates.

Usage: python benchmarks/run.py loader [--data FEATS] [--readers 1,2] [--preset gpu] [--batches N]
       [KEY=VALUE ...]  (loader settings, e.g. bucket_window=4 max_duration=3000)
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import replace
from pathlib import Path

from speechperf.config import load_preset
from speechperf.data.loader import make_loader

GOAL = ("docs/data.md: shards decompressed / shards <= 1.05 over an epoch, >= 2,700 audio s/s delivered per "
        "reader")
REFERENCE = "the bytes of the distinct shards' contents the epoch reads"
RATIO = "bytes decompressed / contents (most readers)"
DATA = True
H100_AUDIO_S_PER_S = 2700.0  # the paper preset on one H100, bf16/fp16, at the embedded corpus's lengths
GPUS = 8


def splits(feats: Path) -> list[str]:
    return sorted(p.name for p in feats.iterdir() if p.name.startswith("train") and (p / "index.json").exists())


def supply(feats: Path, cfg, limit: int) -> dict:
    """Audio seconds and utterances per second delivered after the first batch (start-up)."""
    it = iter(make_loader(feats, splits(feats), cfg, epoch=2, seed=1))
    next(it)
    t, audio, utts, n = time.perf_counter(), 0.0, 0, 0
    for n, b in zip(range(1, limit + 1), it):
        audio, utts = audio + b.audio_seconds, utts + len(b.ids)
    dt = time.perf_counter() - t
    return {"batches": n, "audio_s_per_s": audio / dt, "utts_per_s": utts / dt}


def measure(feats: Path, cfg, readers: int, limit: int) -> dict:
    cfg = replace(cfg, readers=readers)
    row = {"readers": readers, **supply(feats, cfg, limit)}
    with make_loader(feats, splits(feats), cfg, epoch=2, seed=1) as whole:
        for _ in whole:
            pass
        row.update({"decompressed/contents": whole.decompression_ratio(),
                    "shard_reads": sum(whole.shard_reads.values()), "shards": len(whole.shard_reads)})
    return row


def cpu_rate(feats: Path, cfg, limit: int) -> float:
    """Audio seconds one in-process reader builds per CPU second of its own."""
    it = iter(make_loader(feats, splits(feats), replace(cfg, readers=0), epoch=2, seed=1))
    next(it)
    c, audio = time.process_time(), 0.0
    for _, b in zip(range(limit), it):
        audio += b.audio_seconds
    return audio / (time.process_time() - c)


def arguments(p) -> None:
    p.add_argument("overrides", nargs="*", help="loader settings, KEY=VALUE")
    p.add_argument("--preset", default="gpu")
    p.add_argument("--readers", default="1,2", help="comma-separated reader counts")
    p.add_argument("--batches", type=int, default=10**9, help="batches timed per reader count (default: the epoch)")


def run(a) -> dict:
    cfg = load_preset(a.preset, a.overrides).loader
    rows = [measure(a.data, cfg, int(r), a.batches) for r in a.readers.split(",")]
    per_cpu = cpu_rate(a.data, cfg, a.batches)
    best = max(r["audio_s_per_s"] / r["readers"] for r in rows)
    print(f"preset {a.preset} loader {' '.join(a.overrides)}; {os.cpu_count()} CPUs; wall clock")
    for r in rows:
        print(f"  readers {r['readers']}: {r['audio_s_per_s']:8.0f} audio s/s ({r['audio_s_per_s'] / r['readers']:6.0f} "
              f"per reader), {r['utts_per_s']:6.1f} utts/s over {r['batches']} batches; shards decompressed "
              f"{r['shard_reads']} for {r['shards']} (ratio {r['decompressed/contents']:.3f}; goal <= 1.05)")
    need = math.ceil(GPUS * H100_AUDIO_S_PER_S / per_cpu)
    print(f"  {GPUS} H100s (~{GPUS * H100_AUDIO_S_PER_S:.0f} audio s/s): {math.ceil(GPUS * H100_AUDIO_S_PER_S / best)} "
          f"readers at the best rate here ({best:.0f} per reader); one reader in process {per_cpu:.0f} audio s per "
          f"CPU second: {need} cores on an idle machine")
    return {"preset": a.preset, "overrides": a.overrides, "rows": rows, "audio_s_per_cpu_s": per_cpu,
            "ratio": rows[-1]["decompressed/contents"]}
