"""``speechperf prepare`` throughput and memory, per worker count, and a 960 h projection.

Runs ``python -m speechperf prepare CORPUS OUT --workers W`` as a subprocess per worker
count, each into a fresh folder, and samples the process tree with psutil (the parent and
its pool workers, every ``--interval`` seconds): peak RSS of the whole tree (the sum at
each sample) and of any single process. Prints audio hours per wall-clock hour, per
worker, and the speedup against the named reference: the 1-worker run, measured in the
same invocation (give ``--workers 1,...``).

Goal (issue 29): speedup >= 1.8x at 2 workers; peak RSS flat with corpus size (run it on
two corpora, e.g. 1.5 h and 10 h, and compare the ``peak_tree_mb`` columns).

The 960 h line is a PROJECTION, not a measurement: 960 h / (measured audio-h per wall-h
per worker at the largest measured worker count W0 x W). It assumes the per-worker rate
stays what it was at W0 (efficiency does not fall further past W0), that the machine has
W idle cores and a disk that keeps up, and that LibriSpeech's FLAC costs per audio hour
what this corpus's does (feature cost is linear in samples; LibriSpeech's ~12 s
utterances have fewer per-file overheads than the synthetic ~3 s ones, so it is not
pessimistic on that count). The serial part (the parent's scan of the corpus and its
index writing) is inside the measured wall time, so at W >> W0 it is under-weighted.
A second line projects from CPU time instead (audio hours per CPU-hour of every process,
parent included, x W busy cores): on a shared machine, where the workers wait for a core,
it is the closer estimate of what W idle cores do; on an idle machine the two agree.

Usage:
  python benchmarks/bench_prepare.py CORPUS --workers 1,2,4,8 [--repeat 3] [--work DIR] [--json]
  python benchmarks/bench_prepare.py --synth-hours 1.5 --work DIR --workers 1,2
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

PROJECTED_HOURS = 960.0  # LibriSpeech's training audio
PROJECTED_WORKERS = (8, 32, 64)


def synth(root: Path, hours: float) -> Path:
    """A corpus made here with ``speechperf corpus synth`` (kept across invocations)."""
    corpus = root / f"corpus-{hours:g}h"
    subprocess.run([sys.executable, "-m", "speechperf", "corpus", "synth", str(corpus), "--hours", str(hours),
                    "--seed", "1", "--json"], check=True, stdout=subprocess.DEVNULL)
    return corpus


def _tree_rss(proc: psutil.Process) -> tuple[int, int, int, int]:
    """(sum of RSS over the process and its descendants, max single RSS, processes, the
    process's own RSS) in bytes."""
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
    return sum(rss), max(rss, default=0), len(rss), rss[0] if rss else 0


def run_prepare(corpus: Path, out: Path, workers: int, interval: float, extra: list[str]) -> dict:
    """One prepare into a fresh ``out``, timed and sampled."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "speechperf", "prepare", str(corpus), str(out), "--workers", str(workers),
           "--json", *extra]
    before = os.times()
    t0 = time.perf_counter()
    proc = psutil.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak_tree = peak_one = peak_parent = most = samples = 0
    while proc.poll() is None:
        tree, one, n, parent = _tree_rss(proc)
        peak_tree, peak_one, most = max(peak_tree, tree), max(peak_one, one), max(most, n)
        peak_parent = max(peak_parent, parent)
        samples += 1
        time.sleep(interval)
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    after = os.times()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{stderr[-4000:]}")
    rows = json.loads(stdout)
    hours = sum(r["hours"] for r in rows)
    done = sorted(f.stat().st_mtime for f in out.glob("*/shard-*.json"))  # each shard's sidecar: written when it is done
    start = time.time() - wall  # the command's start on the files' clock
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return {"workers": workers, "wall_s": wall, "audio_hours": hours, "utterances": sum(r["kept"] for r in rows),
            "shards": sum(r["shards"] for r in rows), "cpu_s": cpu, "cpu_per_wall": cpu / wall,
            "audio_h_per_cpu_h": hours * 3600 / cpu if cpu else None,
            "audio_h_per_wall_h": hours * 3600 / wall, "per_worker": hours * 3600 / wall / workers,
            "peak_tree_mb": peak_tree / 2**20, "peak_one_mb": peak_one / 2**20,
            "peak_parent_mb": peak_parent / 2**20, "max_processes": most,
            "samples": samples,
            # where the wall time went: to the first shard done (interpreter, imports, the pool's start,
            # torch's import in each worker, the first shard), the shards, and after the last one
            # (index.json, statistics): the serial parts that keep the speedup under W
            "first_shard_s": done[0] - start if done else None, "shards_s": done[-1] - done[0] if done else None,
            "after_last_shard_s": start + wall - done[-1] if done else None}


def median_run(runs: list[dict]) -> dict:
    """The run of median wall time (the lower middle of an even count), with every run's wall time."""
    ranked = sorted(runs, key=lambda r: r["wall_s"])
    return {**ranked[(len(ranked) - 1) // 2], "walls_s": [r["wall_s"] for r in runs], "runs": len(runs)}


def projection(rows: list[dict]) -> dict:
    """960 h wall-clock hours at 8/32/64 workers from the largest measured worker count."""
    top = max(rows, key=lambda r: r["workers"])
    cpu_rate = top["audio_h_per_cpu_h"]
    return {"assumption": f"linear in workers at the per-worker rate measured with {top['workers']} worker(s) "
                          f"({top['per_worker']:.1f} audio-h per wall-h per worker), W idle cores, disk keeping up",
            "from_workers": top["workers"],
            "hours": {w: PROJECTED_HOURS / (top["per_worker"] * w) for w in PROJECTED_WORKERS},
            # the same from CPU time (every process's, parent included): what W uncontended cores would do
            # if each stayed busy; on a shared machine the wall-clock line above is the contended one
            "cpu_assumption": f"{cpu_rate:.0f} audio-h per CPU-h (all processes) on each of W busy cores",
            "hours_cpu_bound": {w: PROJECTED_HOURS / (cpu_rate * w) for w in PROJECTED_WORKERS}}


def report(rows: list[dict], proj: dict, conditions: dict) -> None:
    ref = next((r for r in rows if r["workers"] == 1), None)
    print(f"machine: {conditions['cpus']} logical CPUs, load average before {conditions['load_before']}; "
          f"corpus {conditions['corpus']}")
    print(f"{'workers':>7} {'wall s':>8} {'audio h':>8} {'audio-h/h':>10} {'per worker':>10} {'speedup':>8} "
          f"{'cpu/wall':>8} {'peak tree MB':>12} {'peak one MB':>11} {'parent MB':>9}")
    for r in rows:
        speed = f"{ref['wall_s'] / r['wall_s']:.2f}x" if ref else "-"
        print(f"{r['workers']:>7} {r['wall_s']:>8.1f} {r['audio_hours']:>8.3f} {r['audio_h_per_wall_h']:>10.1f} "
              f"{r['per_worker']:>10.1f} {speed:>8} {r['cpu_per_wall']:>8.2f} {r['peak_tree_mb']:>12.0f} "
              f"{r['peak_one_mb']:>11.0f} {r['peak_parent_mb']:>9.0f}")
    if ref:
        print("speedup: against the 1-worker run of this invocation (goal: >= 1.8x at 2 workers)")
    for r in rows:
        if r.get("runs", 1) > 1:
            paired = ", ".join(f"{x:.2f}" for x in r.get("speedups_paired", []))
            print(f"  {r['workers']} worker(s): median of {r['runs']} runs; wall s {min(r['walls_s']):.1f}-"
                  f"{max(r['walls_s']):.1f}" + (f"; paired speedups {paired}" if paired else ""))
        if r.get("first_shard_s") is not None:
            print(f"  {r['workers']} worker(s): {r['first_shard_s']:.1f} s to the first shard, {r['shards_s']:.1f} s "
                  f"of shards, {r['after_last_shard_s']:.1f} s after the last (index, statistics)")
    print(f"PROJECTION (not measured) for {PROJECTED_HOURS:g} h of LibriSpeech training audio; "
          f"assumption: {proj['assumption']}")
    for w, h in proj["hours"].items():
        print(f"  {w:>3} workers: ~{h:.2f} h wall-clock (projection); from CPU time, every core busy: "
              f"~{proj['hours_cpu_bound'][w]:.2f} h")
    print(f"  (CPU-time line: {proj['cpu_assumption']})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus", nargs="?", type=Path, help="a corpus in the LibriSpeech layout")
    ap.add_argument("--synth-hours", type=float, help="make a corpus of this many train-clean hours under --work")
    ap.add_argument("--workers", default="1,2", help="comma-separated worker counts (include 1: the reference)")
    ap.add_argument("--work", type=Path, help="folder for the outputs (default: a temporary folder, removed)")
    ap.add_argument("--splits", help="pass --splits to prepare (default: every split)")
    ap.add_argument("--interval", type=float, default=0.05, help="RSS sampling interval, seconds")
    ap.add_argument("--keep", action="store_true", help="keep the prepared folders")
    ap.add_argument("--repeat", type=int, default=1, help="run the worker counts this many times, interleaved "
                    "(1, 2, 1, 2, ...): the rows are each count's median run, with the spread of its wall times")
    ap.add_argument("--json", action="store_true", help="print the rows and projection as JSON")
    a = ap.parse_args()
    if (a.corpus is None) == (a.synth_hours is None):
        ap.error("give a CORPUS folder or --synth-hours H")
    workers = [int(w) for w in a.workers.split(",")]
    work = a.work or Path(tempfile.mkdtemp(prefix="bench-prepare-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = a.corpus or synth(work, a.synth_hours)
    extra = ["--splits", a.splits] if a.splits else []
    conditions = {"cpus": os.cpu_count(), "load_before": [round(x, 2) for x in os.getloadavg()],
                  "corpus": str(corpus), "python": sys.version.split()[0]}
    runs: dict[int, list[dict]] = {w: [] for w in workers}
    try:
        for _ in range(a.repeat):
            for w in workers:
                runs[w].append(run_prepare(corpus, work / f"feats-w{w}", w, a.interval, extra))
                if not a.keep:
                    shutil.rmtree(work / f"feats-w{w}", ignore_errors=True)
    finally:
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)
    rows = [median_run(runs[w]) for w in workers]
    ref = next((r for r in rows if r["workers"] == 1), None)
    for r in rows:
        r["speedup_vs_1"] = ref["wall_s"] / r["wall_s"] if ref else None
        if ref and a.repeat > 1:  # each repetition's own pair (run i of 1 worker vs run i of W)
            r["speedups_paired"] = [one["wall_s"] / mine["wall_s"] for one, mine in zip(runs[1], runs[r["workers"]])]
    proj = projection(rows)
    if a.json:
        print(json.dumps({"conditions": conditions, "rows": rows, "projection_960h": proj}, indent=1))
    else:
        report(rows, proj, conditions)


if __name__ == "__main__":
    main()
