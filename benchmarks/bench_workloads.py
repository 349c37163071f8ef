"""The two workloads on one machine: DS2 (`cpu` preset) and Conformer-CTC (`conformer-cpu`)
trained to dev-clean CER 10 with the real train command, their TTAs, MFUs and the ratio
conformer / DS2 TTA against the goal (<= 0.7: a modern recipe should beat the 2019 one).

Both runs use the same features, machine and target; each run's TTA is read from its own
folder as `speechperf tta` reads it (median of the last 3 evaluations, initialization
outside the clock). A run that never reached the target prints NA and no ratio. A folder
that already holds a finished run of the same configuration is reported, not retrained
(the train command's resume), so a second call only prints.

Usage: python benchmarks/bench_workloads.py FEATS OUT [--threads 2] [key=value ...]
(overrides go to both runs, e.g. time_cap_minutes=20)
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

GOAL = 0.7  # conformer TTA / DS2 TTA
TARGET = 10.0  # dev-clean CER, percent
WORKLOADS = (("ds2", "cpu"), ("conformer", "conformer-cpu"))


def train_to_target(preset: str, feats: Path, out: Path, overrides: list[str]) -> dict:
    """Train ``preset`` into ``out`` (or report the finished run there); its TTA row and summary."""
    from speechperf.studies.tta import tta_table
    from speechperf.train.loop import TrainRequest, train

    train(TrainRequest(preset, data=feats, out=out, overrides=[f"target={TARGET}", "target_metric=cer", *overrides]))
    row = tta_table([out], metric="cer", targets=(TARGET,))[0]
    summary = json.loads((out / "summary.json").read_text())
    return {"minutes": row["minutes"], "summary": summary}


def mfu_text(summary: dict) -> str:
    if "mfu_pct" not in summary:
        return "n/a: summary has no mfu_pct"
    return f"{summary['mfu_pct']:.1f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("feats", type=Path, help="prepared features (the embedded corpus)")
    ap.add_argument("out", type=Path, help="folder for the two run folders")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of each run (the demo's 2 cores)")
    ap.add_argument("overrides", nargs="*", help="key=value overrides for both runs")
    a = ap.parse_args()
    from speechperf.models import describe

    from speechperf.config import load_preset

    results = {}
    for name, preset in WORKLOADS:
        overrides = [f"threads={a.threads}", *a.overrides]
        workload = describe(load_preset(preset, overrides).model)
        print(f"training {preset} ({workload['model']}, {workload['params'] / 1e6:.2f} M parameters) "
              f"to dev-clean CER {TARGET:g} ...", flush=True)
        results[name] = train_to_target(preset, a.feats, a.out / preset, overrides)
    print(f"\n{'workload':<12}{'preset':<16}{'TTA (min)':>10}{'epochs':>8}{'iters':>7}  MFU")
    for name, preset in WORKLOADS:
        r, s = results[name], results[name]["summary"]
        tta = "NA" if r["minutes"] is None else f"{r['minutes']:.2f}"
        print(f"{name:<12}{preset:<16}{tta:>10}{s['epochs']:>8}{s['iterations']:>7}  {mfu_text(s)}")
    ds2, conf = results["ds2"]["minutes"], results["conformer"]["minutes"]
    if ds2 is None or conf is None:
        missed = " and ".join(p for n, p in WORKLOADS if results[n]["minutes"] is None)
        print(f"ratio conformer / DS2 TTA: NA ({missed} never reached CER {TARGET:g}); goal <= {GOAL}")
        return
    ratio = conf / ds2
    print(f"ratio conformer / DS2 TTA: {ratio:.2f} (goal <= {GOAL}: {'met' if ratio <= GOAL else 'NOT met'})")


if __name__ == "__main__":
    main()
