"""``speechperf prepare``'s speedup per worker count against one worker, and its memory.

Runs ``python -m speechperf prepare CORPUS OUT --workers W`` as a subprocess per worker count, each
into a fresh folder, and samples its process tree with psutil (the parent and its pool workers,
every ``--interval`` seconds): peak RSS of the whole tree (the sum at each sample), of any single
process and of the parent. The reference, measured in the same invocation: the 1-worker run
(always run first). ``--repeat N`` interleaves the counts (1, 2, 1, 2, ...) and keeps each
count's median run.

Goals (docs/data.md): speedup >= 1.8x at 2 workers; the parent's peak RSS flat in corpus size
(run it on two corpora, e.g. 1.5 h and 10 h, and compare ``peak_parent_mb``).

The 960 h line is a PROJECTION, not a measurement: 960 h / (the audio hours per wall-clock hour
per worker at the most workers measured x W). It assumes that rate holds past them, W idle
cores, a disk that keeps up, and LibriSpeech's FLAC costing per audio hour what this corpus's
does (the serial scan and index writing are in the measured wall time, under-weighted at large W).

Usage: python benchmarks/run.py prepare [--corpus CORPUS | --synth-hours 0.3] [--workers 2]
           [--splits S] [--repeat N] [--work DIR]
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

GOAL = "docs/data.md, docs/librispeech.md: prepare >= 1.8x at 2 workers, its parent's peak RSS flat in corpus size"
REFERENCE = "the 1-worker prepare of the same corpus"
RATIO = "speedup at the most workers (1-worker wall / W-worker wall)"
DATA = False
PROJECTED_HOURS = 960.0  # LibriSpeech's training audio
PROJECTED_WORKERS = (8, 32, 64)


def synth(root: Path, hours: float) -> Path:
    corpus = root / f"corpus-{hours:g}h"
    subprocess.run([sys.executable, "-m", "speechperf", "corpus", "synth", str(corpus), "--hours", str(hours),
                    "--seed", "1", "--json"], check=True, stdout=subprocess.DEVNULL)
    return corpus


def tree_rss(proc: psutil.Process) -> tuple[int, int, int]:
    """(RSS summed over the process and its descendants, the largest one's, the process's own) in bytes."""
    procs = [proc]
    try:
        procs += proc.children(recursive=True)
    except psutil.Error:
        pass
    rss = []
    for p in procs:
        try:
            rss.append(p.memory_info().rss)
        except psutil.Error:  # exited between listing and reading
            pass
    return sum(rss), max(rss, default=0), rss[0] if rss else 0


def run_prepare(corpus: Path, out: Path, workers: int, interval: float, extra: list[str]) -> dict:
    """One prepare into a fresh ``out``, timed and sampled."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "speechperf", "prepare", str(corpus), str(out), "--workers", str(workers),
           "--json", *extra]
    t0 = time.perf_counter()
    proc = psutil.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peaks = [0, 0, 0]
    while proc.poll() is None:
        peaks = [max(a, b) for a, b in zip(peaks, tree_rss(proc))]
        time.sleep(interval)
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{stderr[-4000:]}")
    hours = sum(r["hours"] for r in json.loads(stdout))
    return {"workers": workers, "wall_s": wall, "audio_hours": hours, "audio_h_per_wall_h": hours * 3600 / wall,
            "peak_tree_mb": peaks[0] / 2**20, "peak_one_mb": peaks[1] / 2**20, "peak_parent_mb": peaks[2] / 2**20}


def arguments(p) -> None:
    p.add_argument("--corpus", type=Path, help="a corpus in the LibriSpeech layout (default: one synthesized)")
    p.add_argument("--synth-hours", type=float, default=0.3, help="the synthesized corpus's train-clean hours")
    p.add_argument("--workers", default="2", help="comma-separated worker counts beside the 1-worker reference")
    p.add_argument("--work", type=Path, help="folder for the outputs (default: a temporary folder, removed)")
    p.add_argument("--splits", help="pass --splits to prepare (default: every split)")
    p.add_argument("--interval", type=float, default=0.05, help="RSS sampling interval, seconds")
    p.add_argument("--repeat", type=int, default=1, help="run the worker counts this many times, interleaved")


def run(a) -> dict:
    workers = [1] + [w for w in map(int, a.workers.split(",")) if w != 1]
    work = a.work or Path(tempfile.mkdtemp(prefix="bench-prepare-"))
    work.mkdir(parents=True, exist_ok=True)
    extra = ["--splits", a.splits] if a.splits else []
    runs: dict[int, list[dict]] = {w: [] for w in workers}
    try:
        corpus = a.corpus or synth(work, a.synth_hours)
        for _ in range(a.repeat):
            for w in workers:
                runs[w].append(run_prepare(corpus, work / f"feats-w{w}", w, a.interval, extra))
    finally:
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)
    rows = [sorted(runs[w], key=lambda r: r["wall_s"])[(a.repeat - 1) // 2] for w in workers]
    print(f"corpus {corpus}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; median of {a.repeat}")
    for r in rows:
        r["speedup"] = rows[0]["wall_s"] / r["wall_s"]
        print(f"  {r['workers']} worker(s): {r['wall_s']:.1f} s for {r['audio_hours']:.3f} h "
              f"({r['audio_h_per_wall_h']:.0f} audio-h/h), {r['speedup']:.2f}x; peak RSS: tree "
              f"{r['peak_tree_mb']:.0f} MB, one process {r['peak_one_mb']:.0f}, parent {r['peak_parent_mb']:.0f}")
    per_worker = rows[-1]["audio_h_per_wall_h"] / rows[-1]["workers"]
    projection = {w: PROJECTED_HOURS / (per_worker * w) for w in PROJECTED_WORKERS}
    print(f"PROJECTION (not measured) for {PROJECTED_HOURS:g} h at {per_worker:.1f} audio-h/h per worker: "
          + ", ".join(f"{w} workers ~{h:.2f} h" for w, h in projection.items()))
    return {"corpus_hours": rows[0]["audio_hours"], "rows": rows, "projection_960h_hours": projection,
            "ratio": rows[-1]["speedup"]}
