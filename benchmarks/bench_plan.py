"""Index, planning, padding and batch sizes at LibriSpeech size, against today's loader
(the list-of-dicts index and window planner it replaced, copied below as the reference) and
lhotse's DynamicBucketingSampler, all on one generated index.

The index: LibriSpeech 960 h's three training splits (281,241 utterances, 4,396 shards of
64) with its duration spread (data/index.py ``librispeech_like``), written as index.json
files like ``prepare``'s (transcripts ~15 characters per second) and loaded from them. Goals:
load <= 2 s, plan an epoch <= 2 s, <= 300 MB added to the training process (RSS), <= 50 MB
added to each reader (USS of a forked reader after it touched its share of the index and ran
the garbage collector, as a busy reader does, less that of a reader forked before the index
was loaded), padded / valid frames <= 1.05 with
max_duration, at most one batch per epoch per rank under half its size (every preset).
Each measurement runs in a fresh process. Timings are wall clock on this machine.
Usage: python benchmarks/bench_plan.py [--out DIR] [--json]
"""
from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil

from speechperf.config import load_preset
from speechperf.data.loader_config import LoaderConfig
from speechperf.data.index import librispeech_like
from speechperf.data.loader import load_index
from speechperf.data.plan import batch_cost, plan_epoch
from speechperf.features.shards import load_index as load_split_index

PRESETS = ["cpu", "conformer-cpu", "tiny", "paper", "gpu", "modern", "conformer", "conformer-algoperf-sizes"]
SPLITS = ["train-clean-100", "train-clean-360", "train-other-500"]
READERS = 4  # a reader's share of the batches: every 4th


# ---- the reference: today's index and planner (speechperf/data/loader.py before the compact index)
def old_load_records(feats: Path, splits: list[str]):
    records, shas = [], {}
    for split in splits:
        index = load_split_index(Path(feats) / split)
        for r in index["utterances"]:
            records.append({**r, "key": f"{split}/{r['shard']}"})
        shas.update({f"{split}/{name}": sha for name, sha in index["shards"].items()})
    return records, shas


def old_plan_epoch(records, cfg, epoch, seed):
    rng = np.random.default_rng([seed, epoch])
    by_shard = {}
    for r in records:
        by_shard.setdefault(r["key"], []).append(r)
    shards = sorted(by_shard)
    if cfg.shuffle:
        shards = [shards[i] for i in rng.permutation(len(shards))]
    batches = []
    for w in range(0, len(shards), cfg.bucket_window):
        window = [r for s in shards[w: w + cfg.bucket_window] for r in by_shard[s]]
        if cfg.mode == "bucket" or not cfg.shuffle:
            window.sort(key=lambda r: (r["frames"], r["id"]))
        else:
            window = [window[i] for i in rng.permutation(len(window))]
        cut = [window[i: i + cfg.batch_size] for i in range(0, len(window), cfg.batch_size)]
        batches += [cut[i] for i in rng.permutation(len(cut))]
    return batches


# ---- the generated index on disk
def write_index(out: Path) -> None:
    ix = librispeech_like(0)
    rng = np.random.default_rng(1)
    words = ["the", "of", "and", "a", "to", "in", "he", "was", "that", "his", "it", "with", "had", "for"]
    for s, split in enumerate(SPLITS):
        d = out / split
        d.mkdir(parents=True, exist_ok=True)
        mine = np.flatnonzero(np.char.startswith(np.array(ix.keys)[ix.shard], f"train-{s}/"))
        utts = []
        for i in mine.tolist():
            n = int(ix.duration[i] * 15 / 4)  # ~15 characters per second, words of ~4
            utts.append({"id": ix.id(i), "shard": ix.keys[ix.shard[i]].split("/")[1], "offset": int(ix.offset[i]),
                         "frames": int(ix.frames[i]), "duration": float(ix.duration[i]),
                         "transcript": " ".join(rng.choice(words, n)), "speaker": ix.id(i).split("-")[0]})
        shards = {k.split("/")[1]: "0" * 64 for k in dict.fromkeys(ix.keys[j] for j in ix.shard[mine].tolist())}
        (d / "index.json").write_text(json.dumps({"split": split, "utterances": utts, "shards": shards,
                                                  "problems": []}))


# ---- one measurement, in its own process
def _reader_touch(kind: str, obj, batches, conn) -> None:
    """A reader's work on the index alone: its share of the batches' fields, then a collection."""
    me = psutil.Process()
    before = me.memory_full_info().uss
    if kind == "none":
        pass
    elif kind == "old":
        for b in batches[::READERS]:
            for r in b:
                _ = (r["key"], r["id"], r["transcript"], r["duration"], r["frames"])
    else:
        for b in batches[::READERS]:
            for u in b.tolist():
                _ = (obj.shard[u], obj.id(u), obj.transcript(u), obj.duration[u], obj.frames[u])
    gc.collect()
    conn.send(me.memory_full_info().uss - before)


def _reader_uss(kind: str, obj, batches) -> int:
    ctx = mp.get_context("fork")
    a, b = ctx.Pipe()
    p = ctx.Process(target=_reader_touch, args=(kind, obj, batches, b))
    p.start()
    uss = a.recv()
    p.join()
    return uss


def measure(kind: str, feats: Path) -> dict:
    me = psutil.Process()
    gc.collect()
    baseline = _reader_uss("none", None, [])  # a reader forked before the index exists: its own pages
    rss0 = me.memory_info().rss
    t, c = time.perf_counter(), time.process_time()
    obj = old_load_records(feats, SPLITS)[0] if kind == "old" else load_index(feats, SPLITS)
    load_s, load_cpu = time.perf_counter() - t, time.process_time() - c
    gc.collect()
    added = me.memory_info().rss - rss0
    cfg = LoaderConfig(batch_size=240)
    t, c = time.perf_counter(), time.process_time()
    if kind == "old":
        batches = old_plan_epoch(obj, cfg, 2, 1)
    else:
        batches = plan_epoch(obj, cfg, 2, 1).batches
    row = {"index": kind, "load_s": load_s, "load_cpu_s": load_cpu, "rss_added_mb": added / 1e6,
           "plan_s_240": time.perf_counter() - t, "plan_cpu_s_240": time.process_time() - c}
    if kind == "new":
        gpu = load_preset("gpu").loader
        t, c = time.perf_counter(), time.process_time()
        batches = plan_epoch(obj, gpu, 2, 1).batches
        row["plan_s_gpu_preset"], row["plan_cpu_s_gpu_preset"] = time.perf_counter() - t, time.process_time() - c
    row["reader_uss_mb"] = _reader_uss(kind, obj, batches) / 1e6
    row["reader_uss_added_mb"] = row["reader_uss_mb"] - baseline / 1e6
    return row


# ---- padding and batch counts, ours and lhotse's
def padding_rows(ix) -> list[dict]:
    valid = float(ix.duration.sum())
    rows = []
    for name, cfg in [("today: bucket, 240 (window 8)", LoaderConfig(batch_size=240)),
                      ("today: pad 1670, 240", LoaderConfig(batch_size=240, mode="pad")),
                      ("balanced, 240 (paper preset, pad)", load_preset("paper").loader),
                      ("max_duration 3000, window 8", LoaderConfig(max_duration=3000.0)),
                      ("max_duration 3000, window 64", LoaderConfig(max_duration=3000.0, bucket_window=64)),
                      ("max_duration 3000, window 128 (gpu preset)", load_preset("gpu").loader)]:
        t = time.perf_counter()
        p = plan_epoch(ix, cfg, 2, 1)
        dt = time.perf_counter() - t
        widths = [max(ix.duration[b].max(), cfg.pad_frames / 100 if cfg.mode == "pad" else 0) for b in p.batches]
        rows.append({"planner": name, "batches": len(p), "padded/valid": sum(len(b) * w for b, w in zip(p.batches, widths)) / valid,
                     "plan_s": dt})
    rows += lhotse_rows(ix, valid)
    return rows


def lhotse_rows(ix, valid: float) -> list[dict]:
    from lhotse import CutSet, MonoCut
    from lhotse.dataset import DynamicBucketingSampler

    rss = psutil.Process().memory_info().rss
    t = time.perf_counter()
    cuts = CutSet.from_cuts(MonoCut(id=ix.id(i), start=0.0, duration=float(d), channel=0)
                            for i, d in enumerate(ix.duration.tolist()))
    build_s, build_mb = time.perf_counter() - t, (psutil.Process().memory_info().rss - rss) / 1e6
    rows = []
    for buckets in (10, 30):
        t = time.perf_counter()
        s = DynamicBucketingSampler(cuts, max_duration=3000.0, num_buckets=buckets, shuffle=True, seed=1)
        s.set_epoch(2)
        n, padded = 0, 0.0
        for b in s:
            d = [c.duration for c in b]
            n, padded = n + 1, padded + len(d) * max(d)
        rows.append({"planner": f"lhotse DynamicBucketingSampler, max_duration 3000, {buckets} buckets",
                     "batches": n, "padded/valid": padded / valid, "plan_s": time.perf_counter() - t})
    ranks = []
    for r in (0, 1):
        s = DynamicBucketingSampler(cuts, max_duration=3000.0, num_buckets=30, shuffle=True, seed=1, world_size=2, rank=r)
        s.set_epoch(2)
        ranks.append(sum(1 for _ in s))
    t = time.perf_counter()
    s = DynamicBucketingSampler(cuts, max_duration=3000.0, num_buckets=30, shuffle=True, seed=1)
    s.set_epoch(2)
    it = iter(s)
    for _ in range(600):
        next(it)
    state = s.state_dict()
    want = [c.id for c in next(it)]
    s2 = DynamicBucketingSampler(cuts, max_duration=3000.0, num_buckets=30, shuffle=True, seed=1)
    t = time.perf_counter()
    s2.load_state_dict(state)
    got = [c.id for c in next(iter(s2))]
    resume_s = time.perf_counter() - t
    rows.append({"planner": f"lhotse: CutSet of {len(ix)} MonoCuts built in {build_s:.1f} s, +{build_mb:.0f} MB RSS; "
                 f"2 ranks got {ranks[0]} and {ranks[1]} batches; resume at batch 600 via state_dict took "
                 f"{resume_s:.1f} s and gave {'the same' if got == want else 'ANOTHER'} next batch",
                 "batches": None, "padded/valid": None, "plan_s": None})
    return rows


def small_rows(ix) -> list[dict]:
    rows = []
    for preset in PRESETS:
        cfg = load_preset(preset).loader
        p = plan_epoch(ix, cfg, 2, 1)
        if cfg.max_duration > 0:
            small = sum(batch_cost(ix, b, cfg) < cfg.max_duration / 2 for b in p.batches)
            size = f"max_duration {cfg.max_duration:g} s"
        else:
            small = sum(len(b) < cfg.batch_size / 2 for b in p.batches)
            size = f"{cfg.batch_size} utterances" + (" (balanced)" if cfg.balance else " (today's cut)")
        old = sum(len(b) < cfg.batch_size / 2 for b in plan_epoch(ix, LoaderConfig(batch_size=cfg.batch_size), 2, 1).batches)
        rows.append({"preset": preset, "batch": size, "batches": len(p), "under half": small,
                     "today_batch_size": cfg.batch_size, "today_under_half": old})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("/tmp/speechperf-bench-plan"))
    ap.add_argument("--measure", choices=["old", "new"])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.measure:
        print(json.dumps(measure(a.measure, a.out)))
        return
    if not (a.out / SPLITS[-1] / "index.json").exists():
        write_index(a.out)
    mem = [json.loads(subprocess.run([sys.executable, __file__, "--out", str(a.out), "--measure", k], check=True,
                                     capture_output=True, text=True, env=os.environ).stdout) for k in ("old", "new")]
    ix = load_index(a.out, SPLITS)
    result = {"index": mem, "padding": padding_rows(ix), "batch_sizes": small_rows(ix),
              "utterances": len(ix), "shards": len(set(ix.shard.tolist())), "mean_s": float(ix.duration.mean())}
    if a.json:
        print(json.dumps(result, indent=1))
        return
    print(f"generated index: {result['utterances']} utterances, {result['shards']} shards, mean {result['mean_s']:.2f} s "
          f"(timings: this machine, wall clock)")
    for r in mem:
        print("  " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()))
    o, n = mem
    print(f"  ratios new/today: load {n['load_s'] / o['load_s']:.2f}, training-process MB {n['rss_added_mb'] / o['rss_added_mb']:.2f}, "
          f"reader MB {n['reader_uss_added_mb'] / max(o['reader_uss_added_mb'], 1e-9):.3f}  (goals: load <= 2 s, plan <= 2 s, "
          f"<= 300 MB, reader <= 50 MB)")
    print("padding (padded / valid seconds), one shuffled epoch:")
    for r in result["padding"]:
        if r["batches"] is None:
            print(f"  {r['planner']}")
        else:
            print(f"  {r['planner']:<66} batches {r['batches']:>5}  padded/valid {r['padded/valid']:.3f}  plan {r['plan_s']:.2f} s")
    print("batches under half their configured size, one epoch, 1 rank (goal: at most 1):")
    for r in result["batch_sizes"]:
        print(f"  {r['preset']:<25} {r['batch']:<32} batches {r['batches']:>5}  under half {r['under half']:>4}  "
              f"(today: {r['today_batch_size']} utterances, {r['today_under_half']})")


if __name__ == "__main__":
    main()
