"""Feature shards at LibriSpeech lengths, made from a prepared folder's short utterances.

The embedded corpus's utterances last ~3 s; LibriSpeech's 10-17 s (mean 12.3 s). For the
loader's supply benchmark (bench_loader.py) this concatenates the frames of consecutive
utterances of FEATS (every split, cycled with shifted starts until --hours) into utterances
of 10-17 s, and writes them with the package's own shard writer (features/shards.py): one
training split ``train-long`` with its index.json, and FEATS's stats.json and features.json.
Usage: python benchmarks/long_utterances.py FEATS OUT [--hours 10]
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np

from speechperf.data.loader import load_index
from speechperf.features.shards import read_shard, shard_name, write_json, write_shard


def source_utterances(feats: Path):
    """(frames float32 (T, 93), transcript) of every utterance of every split of FEATS."""
    for split in sorted(p.parent.name for p in feats.glob("*/index.json")):
        ix = load_index(feats, [split])
        for key in dict.fromkeys(ix.keys):
            yield from ((f, t) for f, t, _ in read_shard(feats / f"{key}.npz").values())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("feats", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--hours", type=float, default=10.0)
    a = ap.parse_args()
    src = list(source_utterances(a.feats))
    rng = np.random.default_rng(0)
    split = a.out / "train-long"
    split.mkdir(parents=True, exist_ok=True)
    utts, shards, pending, total, i, turn = [], {}, [], 0.0, 0, 0
    while total < a.hours * 3600:
        want, frames, texts = rng.uniform(10.0, 17.0) * 100, [], []
        while sum(len(f) for f in frames) < want:
            f, t = src[i % len(src)]
            frames.append(f)
            texts.append(t)
            i += 1
            if i % len(src) == 0:  # the next pass starts one utterance later: other concatenations
                turn += 1
                i += turn
        x = np.concatenate(frames)
        pending.append((x, f"long-{len(utts):06d}", " ".join(texts), len(x) / 100))
        utts.append({"id": pending[-1][1], "shard": shard_name(len(shards)), "offset": len(pending) - 1,
                     "frames": len(x), "duration": len(x) / 100, "transcript": pending[-1][2], "speaker": "0"})
        total += len(x) / 100
        if len(pending) == 64:
            shards[shard_name(len(shards))] = flush(split, len(shards), pending)
    if pending:
        shards[shard_name(len(shards))] = flush(split, len(shards), pending)
    write_json(split / "index.json", {"split": "train-long", "utterances": utts, "shards": shards, "problems": []})
    for name in ("stats.json", "features.json"):
        shutil.copy(a.feats / name, a.out / name)
    print(json.dumps({"utterances": len(utts), "shards": len(shards), "hours": round(total / 3600, 2),
                      "mean_s": round(total / len(utts), 2)}))


def flush(split: Path, k: int, pending: list) -> str:
    sha = write_shard(split / f"{shard_name(k)}.npz", [p[0] for p in pending], [p[1] for p in pending],
                      [p[2] for p in pending], [p[3] for p in pending])
    pending.clear()
    return sha


if __name__ == "__main__":
    main()
