"""Issue 23's performance goals for the data-parallel algorithms of the one training loop.

1. Communication per 100 steps: each algorithm trains one epoch of PRESET through
   ``torchrun --nproc-per-node 2 -m speechperf train`` (gloo, CPU, one thread per process,
   same seed), and rank 0's iteration rows (``comm_s``, ``comm_bytes``, ``step_s``) give its
   communication seconds and bytes per 100 steps, printed beside sync's (the reference:
   DDP's gradient all-reduce every step) as ratios.
2. The hooks' cost: one epoch in this process with ``algo.name=single``, every hook the loop
   calls per step (``after_step``, ``comm.take``) and per evaluation (``before_eval``) timed;
   printed as their seconds per step against the median step (goal: within 2%). ``single``'s
   hooks are the loop's whole per-step addition for a one-process run: the step itself is
   the same code as before the algorithms moved into the loop.

    python benchmarks/bench_algorithms.py --data FEATS [--preset tiny] [--algos sync,bsp,bmuf,diloco,easgd]
        [--sync-every 20] [--out DIR] [--json]

The figures are only as quiet as the machine: run it alone (2 processes on 2 cores).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from speechperf.results.run import Run  # noqa: E402
from speechperf.tables import emit  # noqa: E402


def _torchrun(a, algo: str, out: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(29500 + os.getpid() % 1000), "-m", "speechperf", "train", "--preset", a.preset, "--data", str(a.data),
           "--out", str(out), "--json", "train.max_epochs=1", "train.final_splits=none", "train.target=0",
           "train.threads=1", "train.device=cpu", f"algo.name={algo}", *a.set]
    if algo != "sync":
        cmd.append(f"algo.sync_every={a.sync_every}")
    if algo in ("asgd", "easgd"):
        cmd.append("algo.round_robin=true")  # deterministic: the same pushes in the same order every run
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        sys.exit(f"{algo}: torchrun exited {done.returncode}: {done.stderr[-2000:]}")


def communication(a, root: Path) -> list[dict]:
    rows = []
    for algo in a.algos:
        out = root / algo
        if not (out / "summary.json").exists():
            print(f"[{algo}] training one epoch on 2 processes ...", flush=True)
            _torchrun(a, algo, out)
        with Run.open(out) as run:
            it = run.iterations()
        steps = len(it)
        comm_s = sum(r["comm_s"] or 0.0 for r in it)
        comm_b = sum(r["comm_bytes"] or 0 for r in it)
        step_s = sum(r["step_s"] for r in it)
        rows.append({"algo": algo, "steps": steps, "comm s/100 steps": 100 * comm_s / steps,
                     "MB/100 steps": 100 * comm_b / steps / 1e6, "comm share %": 100 * comm_s / step_s,
                     "median step s": statistics.median(r["step_s"] for r in it)})
    ref = next((r for r in rows if r["algo"] == "sync"), None)
    for r in rows:
        r["comm s vs sync"] = r["comm s/100 steps"] / ref["comm s/100 steps"] if ref and ref["comm s/100 steps"] else None
        r["bytes vs sync"] = r["MB/100 steps"] / ref["MB/100 steps"] if ref and ref["MB/100 steps"] else None
    return rows


class _Timed:
    """Accumulates the seconds spent in one method of an object."""

    def __init__(self):
        self.seconds, self.calls = 0.0, 0

    def wrap(self, fn):
        def timed(*args, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self.seconds += time.perf_counter() - t0
                self.calls += 1
        return timed


def hooks(a, root: Path) -> list[dict]:
    """One epoch of ``algo.name=single`` in this process, its per-step hooks timed."""
    from speechperf.algorithms import base, single
    from speechperf.train.loop import TrainRequest, train

    timers = {name: _Timed() for name in ("after_step", "comm.take", "before_eval")}
    originals = (single.Single.after_step, base.CommMeter.take, single.Single.before_eval)
    single.Single.after_step = timers["after_step"].wrap(originals[0])
    base.CommMeter.take = timers["comm.take"].wrap(originals[1])
    single.Single.before_eval = timers["before_eval"].wrap(originals[2])
    out = root / "single-hooks"
    shutil.rmtree(out, ignore_errors=True)  # a finished run would only be read again: no hook called
    try:
        train(TrainRequest(a.preset, a.data, out, ["train.max_epochs=1", "train.final_splits=none", "train.target=0",
                                                   "train.threads=1", "algo.name=single", *a.set], quiet=True))
    finally:
        single.Single.after_step, base.CommMeter.take, single.Single.before_eval = originals
    with Run.open(out) as run:
        steps = [r["step_s"] for r in run.iterations()]
    step = statistics.median(steps)
    per_step = sum(t.seconds for t in timers.values()) / len(steps)
    rows = [(name, t.calls, t.seconds / len(steps)) for name, t in timers.items()]
    rows.append(("all hooks", sum(t.calls for t in timers.values()), per_step))
    return [{"hook": name, "calls": calls, "us per step": 1e6 * sec, "median step ms": 1e3 * step,
             "% of step": 100 * sec / step, "goal <= 2%": ("met" if sec / step <= 0.02 else "NOT met")
             if name == "all hooks" else ""} for name, calls, sec in rows]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="prepared features (the embedded corpus: speechperf demo's)")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--algos", default="sync,bsp,bmuf,diloco,easgd", type=lambda s: s.split(","))
    p.add_argument("--sync-every", type=int, default=20, help="algo.sync_every of the local-SGD algorithms")
    p.add_argument("--set", nargs="*", default=[], help="config overrides k=v for every run")
    p.add_argument("--out", type=Path, default=None, help="run folders (default: a temporary folder)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    root = a.out or Path(tempfile.mkdtemp(prefix="bench-algorithms-"))
    comm = communication(a, root)
    hook = hooks(a, root)
    if a.json:
        import json

        print(json.dumps({"communication": comm, "hooks": hook}, indent=1, default=str))
        return
    print(f"communication per 100 steps, 2 processes (gloo), preset {a.preset}, sync_every {a.sync_every}:")
    emit(comm, False)
    print("\nthe loop's algorithm hooks, algo.name=single, one process:")
    emit(hook, False)


if __name__ == "__main__":
    main()
