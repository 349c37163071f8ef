"""What a loader reader costs per audio second with deflated shards (today's default, the
reference) and with raw ones (``prepare --raw``), on the same frames, in the same process.

The reader's profile on LibriSpeech-length shards (docs/data.md) put zlib's inflate at 48% of
its time, for float16 frames that deflate only ~1.2x. This benchmark copies FEATS's training
splits into a temporary folder with every shard rewritten raw (the same arrays: checked
equal), then builds the same planned batches from both folders with an in-process reader and
prints, per format: disk bytes, audio seconds built per CPU second of the reader
(bench_loader.py's ``cpu_rate``), and the ratio raw / deflated. CPU time, not wall time: on a
busy machine it is what a reader on an idle core would take. Each format is timed
``--repeat`` times, alternating, after one untimed pass (page cache warm for both); the
median is printed with the spread.

Usage: python benchmarks/bench_shard_format.py FEATS [KEY=VALUE ...] [--preset gpu]
       [--batches N] [--repeat 3] [--json]
(FEATS: any prepared folder; LibriSpeech-length shards: benchmarks/long_utterances.py.)
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench_loader import cpu_rate, splits as train_splits
from speechperf.config import load_preset
from speechperf.features.shards import load_index, write_json, write_shard


def raw_copy(feats: Path, out: Path, splits: list[str]) -> Path:
    """``feats``'s ``splits`` with every shard stored raw (same arrays), the index's checksums updated."""
    for name in ("stats.json", "features.json"):
        shutil.copy(feats / name, out / name)
    cfg = json.loads((out / "features.json").read_text())
    write_json(out / "features.json", {**cfg, "compress": False})
    for split in splits:
        (out / split).mkdir(parents=True)
        index = load_index(feats / split)
        for shard in index["shards"]:
            z = np.load(feats / split / f"{shard}.npz")
            frames, offsets = z["feats"], z["offsets"]
            rows = [frames[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
            index["shards"][shard] = write_shard(out / split / f"{shard}.npz", rows, list(z["ids"]),
                                                 list(z["transcripts"]), list(z["durations"]), compress=False)
            again = np.load(out / split / f"{shard}.npz")
            if not all(np.array_equal(z[k], again[k]) for k in z.files):
                sys.exit(f"{split}/{shard}: the raw copy differs from the original")
        write_json(out / split / "index.json", index)
    return out


def disk_bytes(feats: Path, splits: list[str]) -> int:
    return sum(p.stat().st_size for s in splits for p in (feats / s).glob("shard-*.npz"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("feats", type=Path)
    ap.add_argument("overrides", nargs="*", help="loader settings, KEY=VALUE (e.g. max_duration=3000 bucket_window=4)")
    ap.add_argument("--preset", default="gpu")
    ap.add_argument("--batches", type=int, default=10**9, help="batches built per pass (default: the epoch)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    cfg = load_preset(a.preset, [f"loader.{o}" for o in a.overrides]).loader
    splits = train_splits(a.feats)
    with tempfile.TemporaryDirectory(prefix="bench-shard-format-") as tmp:
        raw = raw_copy(a.feats, Path(tmp), splits)
        folders = {"deflated (reference)": a.feats, "raw": raw}
        rates: dict[str, list[float]] = {k: [] for k in folders}
        for f in folders.values():  # untimed: both folders in the page cache
            cpu_rate(f, cfg, a.batches)
        for _ in range(a.repeat):
            for k, f in folders.items():
                rates[k].append(cpu_rate(f, cfg, a.batches))
        rows = [{"format": k, "disk_mb": disk_bytes(f, splits) / 2**20, "audio_s_per_cpu_s": statistics.median(rates[k]), "min": min(rates[k]), "max": max(rates[k])}
                for k, f in folders.items()]
    ref = rows[0]["audio_s_per_cpu_s"]
    for r in rows:
        r["vs_deflated"] = r["audio_s_per_cpu_s"] / ref
    if a.json:
        print(json.dumps({"feats": str(a.feats), "preset": a.preset, "overrides": a.overrides, "repeat": a.repeat,
                          "rows": rows}, indent=1))
        return
    print(f"{a.feats} ({', '.join(splits)}), preset {a.preset} {' '.join(a.overrides)}; median of {a.repeat}")
    print(f"{'format':>22} {'disk MB':>9} {'audio s / CPU s':>16} {'spread':>17} {'vs deflated':>11}")
    for r in rows:
        print(f"{r['format']:>22} {r['disk_mb']:>9.1f} {r['audio_s_per_cpu_s']:>16.0f} "
              f"{r['min']:>8.0f}-{r['max']:<8.0f} {r['vs_deflated']:>10.2f}x")


if __name__ == "__main__":
    main()
