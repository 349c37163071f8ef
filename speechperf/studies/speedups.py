"""The sweep's table: one row per run of an algorithm and worker count, its training seconds
per epoch and speedup over the one-process run, the last value of each target metric, TTA to the
run's own target, the share of training seconds spent communicating and MFU. ``speechperf
parallel sweep`` (drive/sweep.py) prints it for the runs it trained; the report shows it for
its runs (``report_rows``).
"""
from __future__ import annotations

from pathlib import Path

from speechperf.algorithms import periodic
from speechperf.config.training import target_rule
from speechperf.metric import per_epoch
from speechperf.scoring.target_rule import tta_minutes
from speechperf.results.view import RunView
from speechperf.studies.precisions import each_at_best, precision
from speechperf.results.workload import workload_label
from speechperf.hardware.machine import devices

ONE_PROCESS = ("single", "sync")  # algo.name of an ordinary run (sync on one process is a plain run)


def runs_table(folders: list[Path]) -> list[dict]:
    """One row per run folder; speedups against the first (the one worker)."""
    facts = [_facts(f) for f in folders]
    base = facts[0]["train_s_per_epoch"]
    return [_row(f, base, facts[0]["precision"]) for f in facts]


def report_rows(runs: list[dict]) -> list[dict]:
    """The sweep's table of a report's runs (``report.runs.load_run`` dicts): one row per run of
    every workload and machine that has a run of another algorithm or worker count than one
    process; the speedups against the first one-process run of the same workload on the same
    machine (None where there is none: a speedup across machines would measure the machines)."""
    groups: dict[tuple, list] = {}
    for r in runs:
        groups.setdefault((workload_label(r["workload"]), devices(r["env"])[1]), []).append(r)
    rows = []
    for (work, machine), group in groups.items():
        facts = [run_facts(r["summary"], r["config"], r["env"], r["iterations"], r["evals"], r["label"]) for r in group]
        if all(f["workers"] == 1 and f["algo"] in ONE_PROCESS for f in facts):
            continue  # nothing parallel to compare in this workload on this machine
        one = next((f for f in facts if f["workers"] == 1), None)
        base = one["train_s_per_epoch"] if one else None
        rows += [{"workload": work, "machine": machine, **_row(f, base, one and one["precision"])} for f in facts]
    return rows


def _facts(folder: Path) -> dict:
    run = RunView.open(folder)
    try:
        return run_facts(run.summary() or {}, run.config, run.env, run.rows.iterations(), run.rows.evals(), folder.name)
    finally:
        run.close()


def run_facts(summary: dict, config: dict, env: dict, its: list[dict], evals: list[dict], name: str) -> dict:
    """What the sweep's table says of one run, from its recorded rows (nothing recomputed but
    sums): training seconds per epoch, the last value of each target metric, TTA to the run's
    own target on the run's clock, the share of training seconds spent communicating and bytes
    sent per step."""
    train_s = sum(r["step_s"] for r in its)
    comm_s = sum(r.get("comm_s") or 0.0 for r in its)
    comm_bytes = sum(r.get("comm_bytes") or 0 for r in its)
    tc, algo = config.get("train", {}), config.get("algo", {})
    metric, target, window = target_rule(tc)
    tta = tta_minutes([(e["clock_s"], e[metric]) for e in evals], target, window) if target > 0 else None
    epochs = max(summary.get("epochs") or 0, 1)
    return {"algo": algo.get("name", "sync"), "workers": env.get("world_size") or 1,
            "sync_every": algo.get("sync_every") if periodic(algo.get("name", "sync")) else None,
            "epochs": summary.get("epochs"), "train_s_per_epoch": train_s / epochs,
            **{m.name: summary.get(f"last_{m.name}") for m in per_epoch()}, "tta_min": tta,
            "comm_pct": 100 * comm_s / train_s if train_s else None,
            "comm_mb_per_step": comm_bytes / len(its) / 1e6 if its else None, "mfu_pct": summary.get("mfu_pct"),
            "status": summary.get("status"), "run": name, "precision": precision(config)}


def _row(f: dict, base: float | None, base_precision: str | None = None) -> dict:
    """A run's row; its speedup against ``base`` seconds per epoch, said "each at its best" where
    the base run (in ``base_precision``) trained in another precision."""
    best = each_at_best([base_precision, f["precision"]]) if base and base_precision else None
    return {"algorithm": f["algo"], "workers": f["workers"], "precision": f["precision"], "sync every": f["sync_every"],
            "epochs": f["epochs"], "train s/epoch": f["train_s_per_epoch"],
            "speedup": base / f["train_s_per_epoch"] if base and f["train_s_per_epoch"] else None, "speedup note": best,
            **{m.label: f.get(m.name) for m in per_epoch()}, "TTA min": f["tta_min"], "comm %": f["comm_pct"],
            "comm MB/step": f["comm_mb_per_step"], "MFU %": f["mfu_pct"], "status": f["status"], "run": f["run"]}
