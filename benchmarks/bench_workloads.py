"""The two workloads on one machine: DS2 (``cpu`` preset) and Conformer-CTC (``conformer-cpu``)
trained to dev-clean CER 10 with the real train command, their TTAs and MFUs side by side.

Both runs use the same features, machine, threads and target; each run's TTA is read from its own
folder as ``speechperf tta`` reads it (median of the last 3 evaluations, initialization outside
the clock). A run that never reached the target reads NA and gives no ratio. A folder that
already holds a finished run is reported, not retrained (the train command's resume), so a
second call only prints.

Usage: python benchmarks/run.py workloads [--data FEATS] [--out bench-workloads] [--threads 2]
           [key=value ...]  (overrides to both runs, e.g. train.stop.time_cap_minutes=20)
"""
from __future__ import annotations

import json
from pathlib import Path

from bench_paper_vs_modern import train, tta_minutes

GOAL = "docs/workloads.md: the Conformer's TTA to CER 10 at most 0.7 of DS2's on the same 2 cores"
REFERENCE = "DS2's TTA (the cpu preset), trained in the same call on the same features"
RATIO = "conformer TTA / DS2 TTA"
DATA = True
TARGET = 10.0  # dev-clean CER, percent
WORKLOADS = (("ds2", "cpu"), ("conformer", "conformer-cpu"))


def arguments(p) -> None:
    p.add_argument("--out", type=Path, default=Path("bench-workloads"), help="folder for the two run folders")
    p.add_argument("--threads", type=int, default=2, help="torch threads of each run (the demo's 2 cores)")
    p.add_argument("overrides", nargs="*", help="key=value overrides for both runs")


def run(a) -> dict:
    runs = [a.out / preset for _, preset in WORKLOADS]
    for (_, preset), folder in zip(WORKLOADS, runs):
        print(f"training {preset} to dev-clean CER {TARGET:g} ...", flush=True)
        train(preset, folder, a.data, [f"train.stop.target={TARGET}", "train.stop.target_metric=cer",
                                       f"train.system.threads={a.threads}", *a.overrides])
    minutes = tta_minutes(runs, TARGET)
    figures = {}
    print(f"{'workload':<12}{'preset':<16}{'TTA (min)':>10}{'epochs':>8}  MFU")
    for (name, preset), folder, tta in zip(WORKLOADS, runs, minutes):
        summary = json.loads((folder / "summary.json").read_text())
        figures[name] = {"preset": preset, "tta_min": tta, "epochs": summary.get("epochs"),
                         "mfu_pct": summary.get("mfu_pct")}
        mfu = "n/a" if summary.get("mfu_pct") is None else f"{summary['mfu_pct']:.1f}%"
        print(f"{name:<12}{preset:<16}{'NA' if tta is None else f'{tta:.2f}':>10}{summary.get('epochs'):>8}  {mfu}")
    ds2, conformer = minutes
    return {**figures, "threads": a.threads, "ratio": conformer / ds2 if ds2 and conformer else None}
