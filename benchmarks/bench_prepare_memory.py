"""``prepare``'s parent process at LibriSpeech size, without audio: what it holds per utterance.

The parent of ``speechperf prepare`` holds, per split, what is not audio: the scan's
utterances and the index it writes from the shards' sidecars. At 960 h (281,241 training
utterances in 4,395 shards of 64) both are large, and the features' time makes a real 960 h
prepare impossible here; the memory needs no audio. This script makes 281,241 sidecar
records shaped like LibriSpeech's (ids, ~180-character transcripts, frame counts, 93-dim
sums per shard) and measures, each in a fresh process (peak RSS, /proc's VmHWM, minus the
process's RSS before the work):

- ``index, before``: the previous code path, replicated here as the named reference: every
  sidecar loaded, one index dict, ``json.dumps(index, indent=1)``, written;
- ``index, now``: ``features/index_stream.write_index`` (one sidecar at a time);
- ``scan, before``: the 281,241 ``Utterance`` objects the previous ``scan_split`` held for
  the split (now ``iter_split`` holds one chapter's);

and checks that both index files are byte-identical. Goal: peak RSS flat with corpus size.
Usage: python benchmarks/bench_prepare_memory.py [--utterances 281241] [--json]
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

LIBRISPEECH_TRAIN = 281_241
PER_SHARD = 64


def make_sidecars(folder: Path, utterances: int) -> int:
    """Sidecars shard-00000.json... as prepare's workers write them; returns the shard count."""
    from speechperf.features.shards import shard_name, write_json

    rng = random.Random(0)
    words = ["the", "of", "and", "chapter", "little", "whom", "upon", "morning", "thought", "never"]
    shards = -(-utterances // PER_SHARD)
    for k in range(shards):
        recs = []
        for i in range(min(PER_SHARD, utterances - k * PER_SHARD)):
            spk, dur = rng.randrange(20, 9000), rng.uniform(1.5, 16.7)
            text = " ".join(rng.choice(words) for _ in range(33))  # ~180 characters, LibriSpeech's mean
            recs.append({"id": f"{spk}-{rng.randrange(10**5)}-{i:04d}", "shard": shard_name(k), "offset": i,
                         "frames": int(dur * 100) + 1, "duration": dur, "transcript": text, "speaker": str(spk)})
        sums = {"n": sum(r["frames"] for r in recs), "sum": np.random.default_rng(k).normal(size=93).tolist(),
                "sumsq": np.random.default_rng(k + 10**6).random(93).tolist()}
        write_json(folder / f"{shard_name(k)}.json", {"shard": shard_name(k), "sha256": f"{k:064x}",
                                                      "records": recs, "problems": [], "sums": sums})
    return shards


def _status_mb(field: str) -> float:
    """/proc/self/status's VmRSS (now) or VmHWM (peak) in MB. Not getrusage's ru_maxrss: Linux
    carries the forking parent's peak across exec into it, so a child of a big parent reads big."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status (Linux only)")


def child(mode: str, folder: Path, shards: int) -> dict:
    """One measurement in this (fresh) process."""
    from speechperf.corpus.librispeech import Utterance
    from speechperf.features.index_stream import write_index
    from speechperf.features.shards import shard_name, write_json

    base, t0 = _status_mb("VmRSS"), time.perf_counter()
    if mode == "index-now":
        write_index(folder, "train-960", shards, [])
    elif mode == "index-before":  # the previous _prepare_split, as it was
        metas = [json.loads((folder / f"{shard_name(k)}.json").read_text()) for k in range(shards)]
        index = {"split": "train-960", "utterances": [r for m in metas for r in m["records"]],
                 "shards": {m["shard"]: m["sha256"] for m in metas if m["records"]},
                 "problems": [p for m in metas for p in m["problems"]],
                 "sums": {"n": sum(m["sums"]["n"] for m in metas),
                          "sum": np.sum([m["sums"]["sum"] for m in metas], 0).tolist(),
                          "sumsq": np.sum([m["sums"]["sumsq"] for m in metas], 0).tolist()}}
        write_json(folder / "index.json", index)
    elif mode == "scan-before":  # what scan_split's list held for the whole split
        held = [Utterance(f"{i % 9000}-{i // 64}-{i % 64:04d}", "train-960", str(i % 9000), str(i // 64),
                          folder / "train-960" / str(i % 9000) / str(i // 64) / f"{i % 9000}-{i // 64}-{i:04d}.flac",
                          ("the little chapter of whom upon " * 6)[:180] + str(i)) for i in range(shards * PER_SHARD)]
        assert held
    peak = _status_mb("VmHWM")
    return {"mode": mode, "added_peak_mb": peak - base, "seconds": time.perf_counter() - t0}


def run(mode: str, folder: Path, shards: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", mode, "--folder", str(folder), "--shards", str(shards)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--utterances", type=int, default=LIBRISPEECH_TRAIN)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--shards", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.folder, a.shards)))
        return
    with tempfile.TemporaryDirectory(prefix="bench-prepare-memory-") as tmp:
        folder = Path(tmp)
        shards = make_sidecars(folder, a.utterances)
        rows = [run("index-before", folder, shards)]
        before = (folder / "index.json").read_bytes()
        rows.append(run("index-now", folder, shards))
        same = (folder / "index.json").read_bytes() == before
        size_mb = len(before) / 2**20
        rows.append(run("scan-before", folder, shards))
    result = {"utterances": a.utterances, "shards": shards, "index_json_mb": size_mb, "identical_bytes": same,
              "rows": rows}
    if a.json:
        print(json.dumps(result, indent=1))
        return
    print(f"{a.utterances} utterances in {shards} shards; index.json {size_mb:.0f} MB; "
          f"before/now bytes identical: {same}")
    for r in rows:
        print(f"  {r['mode']:<13} peak RSS added {r['added_peak_mb']:>7.0f} MB  {r['seconds']:6.1f} s")
    ref, now = rows[0]["added_peak_mb"], rows[1]["added_peak_mb"]
    print(f"index: now / before (named reference: the previous code path) = {now / ref:.3f}")
    if not same:
        raise SystemExit("index.json differs between the two code paths")


if __name__ == "__main__":
    main()
