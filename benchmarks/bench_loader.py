"""Loader supply and decompression per epoch, against today's reader (copied below as the
reference), on the same prepared features and the same planned batches.

For each reader count R: the audio seconds and utterances per second delivered to the
training process (after decompression, normalization, padding and the hand-over between
processes; the first batch, start-up, not counted), per reader, and the shards decompressed
over the epoch, counted: bytes decompressed / bytes of the distinct shards' contents (goal
<= 1.05; today's reader, batch i to reader i mod R, beside it). Then how many readers the
paper preset on eight H100s needs (8 x ~2,700 audio s/s measured for one H100 at the
embedded corpus's lengths; goal >= 2,700 audio s/s per reader). ``--profile``: where an
in-process reader's time goes (cProfile).

LibriSpeech-length shards: benchmarks/long_utterances.py makes them from any prepared folder.
Usage: python benchmarks/bench_loader.py FEATS [--readers 1,2,4,8] [--preset gpu] [KEY=VALUE ...]
       [--batches N] [--profile] [--json]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import os
import pstats
import tempfile
import time
from collections import Counter, OrderedDict
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from speechperf.config import load_preset
from speechperf.corpus import alphabet
from speechperf.data.loader import Batch, make_loader
from speechperf.features.shards import read_shard
from speechperf.features.stats import read_stats

H100_AUDIO_S_PER_S = 2700.0  # the paper preset on one H100, bf16/fp16 (the figures, embedded corpus)
GPUS = 8


def splits(feats: Path) -> list[str]:
    return sorted(p.name for p in feats.iterdir() if p.name.startswith("train") and (p / "index.json").exists())


# ---- the reference: today's reader (map-style; batch i read by reader i mod R; an LRU of window + 2 shards)
class TodaysBatches(Dataset):
    def __init__(self, batches, index, feats: Path, cfg, stats, log: str):
        self.batches, self.ix, self.feats, self.cfg, self.stats, self.log = batches, index, feats, cfg, stats, log
        self.cache: OrderedDict = OrderedDict()

    def __len__(self):
        return len(self.batches)

    def _shard(self, s: int) -> dict:
        if s not in self.cache:
            key = self.ix.keys[s]
            self.cache[s] = read_shard(self.feats / f"{key}.npz", self.ix.shas[s])
            with open(self.log, "a") as f:  # every decompression, from whichever reader process
                f.write(f"{key}\n")
            while len(self.cache) > self.cfg.bucket_window + 2:
                self.cache.popitem(last=False)
        self.cache.move_to_end(s)
        return self.cache[s]

    def __getitem__(self, i):
        utts = self.batches[i].tolist()
        feats = [self._shard(int(self.ix.shard[u]))[self.ix.id(u)][0] for u in utts]
        if self.stats is not None:
            feats = [(f - self.stats[0]) / self.stats[1] for f in feats]
        lens = [len(f) for f in feats]
        width = max(max(lens), self.cfg.pad_frames) if self.cfg.mode == "pad" else max(lens)
        x = np.zeros((len(feats), width, feats[0].shape[1]), dtype=np.float32)
        for b, f in enumerate(feats):
            x[b, : len(f)] = f
        texts = [self.ix.transcript(u) for u in utts]
        labels = [alphabet.encode(t) for t in texts]
        return Batch(torch.from_numpy(x), torch.tensor(lens), torch.tensor([c for lab in labels for c in lab]),
                     torch.tensor([len(lab) for lab in labels]), [self.ix.id(u) for u in utts], texts,
                     float(sum(self.ix.duration[utts].tolist())))


def supply(batches_iter, limit: int) -> dict:
    it = iter(batches_iter)
    next(it)  # start-up (reader processes, first shards) is not steady state
    t, audio, utts, n = time.perf_counter(), 0.0, 0, 0
    for n, b in zip(range(1, limit + 1), it):
        audio, utts = audio + b.audio_seconds, utts + len(b.ids)
    dt = time.perf_counter() - t
    return {"batches": n, "audio_s_per_s": audio / dt, "utts_per_s": utts / dt}


def measure(feats: Path, cfg, readers: int, limit: int) -> dict:
    cfg = replace(cfg, readers=readers)
    new = make_loader(feats, splits(feats), cfg, epoch=2, seed=1)
    row = {"readers": readers, **supply(new, limit)}
    whole = make_loader(feats, splits(feats), cfg, epoch=2, seed=1)
    for _ in whole:
        pass
    row["decompressed/contents"] = whole.decompression_ratio()
    row["shard_reads"] = sum(whole.shard_reads.values())
    row["shards"] = len(whole.shard_reads)
    with tempfile.NamedTemporaryFile("r", suffix=".log") as log:
        stats = read_stats(feats) if cfg.normalize else None
        old = TodaysBatches(whole.plan.batches, whole.reader.index, feats, cfg, stats, log.name)
        loader = DataLoader(old, batch_size=None, num_workers=readers,
                            prefetch_factor=max(1, -(-cfg.prefetch_batches // readers)))
        for _ in loader:
            pass
        opened = Counter(log.read().split())
    row["today: shard_reads"] = sum(opened.values())
    row["today: decompressed/contents"] = sum(opened[k] * whole.shard_bytes[k] for k in opened) / sum(whole.shard_bytes.values())
    return row


def cpu_rate(feats: Path, cfg, limit: int) -> float:
    """Audio seconds one reader builds per CPU second of its own (in process, hand-over aside):
    a figure a busy machine skews far less than wall-clock rates."""
    it = iter(make_loader(feats, splits(feats), replace(cfg, readers=0), epoch=2, seed=1))
    next(it)
    c, audio = time.process_time(), 0.0
    for _, b in zip(range(limit), it):
        audio += b.audio_seconds
    return audio / (time.process_time() - c)


def profile(feats: Path, cfg, limit: int) -> str:
    """cProfile of an in-process reader building ``limit`` batches: where a reader's time goes."""
    loader = make_loader(feats, splits(feats), replace(cfg, readers=0), epoch=2, seed=1)
    prof = cProfile.Profile()
    prof.enable()
    for _, _b in zip(range(limit), loader):
        pass
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
    return out.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("feats", type=Path)
    ap.add_argument("overrides", nargs="*", help="loader settings, KEY=VALUE (e.g. bucket_window=4 max_duration=3000)")
    ap.add_argument("--preset", default="gpu")
    ap.add_argument("--readers", default="1,2")
    ap.add_argument("--batches", type=int, default=10**9, help="batches timed per reader count (default: the epoch)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    cfg = load_preset(a.preset, a.overrides).loader
    rows = [measure(a.feats, cfg, int(r), a.batches) for r in a.readers.split(",")]
    best = max(r["audio_s_per_s"] / r["readers"] for r in rows)
    need = math.ceil(GPUS * H100_AUDIO_S_PER_S / best)
    per_cpu = cpu_rate(a.feats, cfg, a.batches)
    result = {"cpu_count": os.cpu_count(), "loader": vars(cfg), "rows": rows, "readers_needed_8xH100": need,
              "audio_s_per_cpu_s": per_cpu, "readers_needed_8xH100_by_cpu": math.ceil(GPUS * H100_AUDIO_S_PER_S / per_cpu)}
    if a.profile:
        result["profile"] = profile(a.feats, cfg, min(a.batches, 20))
    if a.json:
        print(json.dumps(result, indent=1, default=str))
        return
    print(f"{a.feats}, preset {a.preset} loader {a.overrides or ''}: {cfg}; {os.cpu_count()} CPUs; wall clock")
    for r in rows:
        print(f"  readers {r['readers']}: {r['audio_s_per_s']:8.0f} audio s/s ({r['audio_s_per_s'] / r['readers']:6.0f} "
              f"per reader), {r['utts_per_s']:6.1f} utts/s over {r['batches']} batches; shards decompressed "
              f"{r['shard_reads']} for {r['shards']} (ratio {r['decompressed/contents']:.3f}; today "
              f"{r['today: shard_reads']}, ratio {r['today: decompressed/contents']:.3f}; goal <= 1.05)")
    print(f"  paper preset on {GPUS} H100s (~{GPUS * H100_AUDIO_S_PER_S:.0f} audio s/s): {need} readers at the best "
          f"per-reader rate here ({best:.0f} audio s/s; goal >= {H100_AUDIO_S_PER_S:.0f} per reader)")
    print(f"  one reader in process: {per_cpu:.0f} audio s per CPU second of its own: "
          f"{result['readers_needed_8xH100_by_cpu']} readers (cores) for {GPUS} H100s on an idle machine")
    if a.profile:
        print(result["profile"])


if __name__ == "__main__":
    main()
