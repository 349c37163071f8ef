"""A TTA study: the per-run TTA table, the seeds of each configuration and machine
aggregated, and the machines compared (what ``speechperf tta`` prints)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from speechperf.config.training import target_rule
from speechperf.metric import DEFAULT_TARGET, measured
from speechperf.studies import rcp
from speechperf.studies.precisions import precision
from speechperf.studies.curve import run_reproduction
from speechperf.studies.aggregate import SeedRun, aggregate, outcome, speed_notes
from speechperf.scoring.targets import METRICS, parse_targets
from speechperf.studies.tta import evaluations, notes, tta_table
from speechperf.results.layout import EVENTS_FILE
from speechperf.results.labels import unique_labels
from speechperf.results.view import RunView
from speechperf.results.workload import workload, workload_label
from speechperf.hardware.machine import machine_name


def seed_run(label: str, config: dict, env: dict, status: str | None, evals: list[dict], metric: str,
             folder: Path | None = None, work: dict | None = None) -> SeedRun:
    """A run as aggregation sees it, from what every reader already holds (its label, config,
    env, status and per-epoch evaluation rows); ``folder``: where its events.log names its corpus;
    ``work``: its recorded workload (``RunView.workload``; None: from ``config``, built-in models only)."""
    return SeedRun(label=label, workload=workload_label(work or workload(config)), machine=machine_name(env),
                   config=config, status=status, evals=tuple((e["clock_s"], e[metric]) for e in evals),
                   corpus=rcp.corpus_of(Path(folder) / EVENTS_FILE) if folder else {},
                   reproduction=run_reproduction(config, env, evals))


def targets_for(spec, metric: str, required: bool = True):
    """``targets_of(run)`` for :func:`aggregate`: the targets ``spec`` gives the run's model
    (``required``: refusing a model it has none for, as ``tta`` does; else none)."""
    pick = spec.require if required else spec.of
    return lambda r: pick(metric, workload(r.config)["model"])


def tta_study(runs: Sequence[Path], metric: str = DEFAULT_TARGET, targets="paper", epochs: int = 3,
              price_per_hour: float | None = None, platform_file: Path | None = None) -> dict:
    """{"runs": per-run rows (:func:`speechperf.studies.tta.tta_table`'s, with epochs to target,
    minutes per epoch and the reference check), "groups": the seeds of one workload,
    configuration and machine aggregated, "comparisons": every two groups of a workload,
    "evaluations": every run's per-epoch validation errors with their 95% intervals}."""
    spec = parse_targets(targets, metric)
    table = tta_table(runs, metric, spec, epochs, price_per_hour, platform_file)
    opened = [RunView.open(Path(r)) for r in runs]
    try:
        labels = unique_labels(opened)
        seeds = [_of_open(r, label, metric) for r, label in zip(opened, labels)]
        evals = [row for r, label in zip(opened, labels) for row in evaluations(r, label)]
    finally:
        for r in opened:
            r.close()
    per_run, groups, comparisons = aggregate(seeds, targets_for(spec, metric), metric, epochs)
    extra = {(r["run"], r["target"]): {k: v for k, v in r.items() if k not in ("run", "target", "minutes")}
             for r in per_run}
    return {"runs": [{**row, **extra.get((row["run"], row["target"]), {})} for row in table],
            "groups": groups, "comparisons": comparisons, "evaluations": evals}


def _of_open(run, label: str, metric: str) -> SeedRun:
    """:func:`seed_run` of an open RunView."""
    return seed_run(label, run.config, run.env, run.rows.row().get("status"),
                    run.rows.evals(), metric, run.folder, run.workload)


def study_notes(study: dict) -> list[str]:
    """What the text tables leave implicit: how seeds are grouped and counted."""
    lines = notes(study["runs"])
    lines.append("Groups: runs of one workload, configuration apart from train.seed, and machine. A run that never "
                 "reached a target is a failed run (MLPerf): slower than any TTA in the median and the interval, a "
                 "dropped score in the olympic mean (one tolerated); unfinished runs are counted apart, not in the "
                 "statistics. TTA = epochs to target (the recipe's, spread by seeds) x min/epoch (the hardware's).")
    lines.append("Error at TTA [95%]: the validation error at the evaluation where the target was declared, with its "
                 "95% bootstrap interval over the validation utterances (the split's resolution, "
                 "not the seeds' spread; "
                 "none for rows recorded before it).")
    lines += speed_notes(study["groups"])
    lines += sorted({f"{r['run']}: {r['reproduction']}" for r in study["runs"] if r.get("reproduction")})
    if study["comparisons"]:
        lines.append("Ratios: median of the seed-pair TTA ratios A/B with an exact 95% (Mann-Whitney) interval; an "
                     "interval holding 1 means these seeds cannot tell the two apart.")
    return lines


def seed_runs_table(loaded: list[dict], spec, window: int = 3) -> tuple[list[dict], list[dict], list[dict]]:
    """:func:`aggregate` over the report's loaded runs (studies/report/runs.py ``load_run``), for every
    metric ``spec`` has targets of: (per-run factor rows, group rows, comparison rows)."""
    out: tuple[list, list, list] = ([], [], [])
    for metric in METRICS:
        runs = [seed_run(r["label"], r["config"], r["env"], r["row"].get("status"), r["evals"], metric, Path(r["run"]),
                         r["workload"])
                for r in loaded if not r["evals"] or measured(r["evals"], metric)]  # not measured: not a seed of it
        runs = [r for r, targets in zip(runs, map(targets_for(spec, metric, required=False), runs)) if targets]
        for part, rows in zip(out, aggregate(runs, targets_for(spec, metric, required=False), metric, window)):
            part += [{"metric": metric, **row} for row in rows]
    return out


def run_check(run: RunView, status: str) -> dict:
    """The finished ``run`` (the recorder's Run, handed the check by TrainRequest.check) against
    its preset's reference, for its summary.json: per target of the reference (else the run's own
    train.stop.target) the epochs to it and the check; a run without a reference says so. Never
    raises: a damaged reference file is named in the result instead (the run itself is over and
    recorded)."""
    config, env, evals, folder = run.config, run.env, run.rows.evals(), run.folder
    train = config.get("train", {})
    metric, _, window = target_rule(train)
    try:
        ref = rcp.load_reference(config.get("preset"), precision(config))
    except rcp.ReferenceError as e:
        return {"reference": None, "check": str(e)}
    own = train["stop"]["target"]
    targets = (ref or {}).get("targets") or ([own] if own else [])
    run = seed_run(str(folder), config, env, status, evals, metric, folder, run.workload)
    checks = []
    for target in targets:
        o = outcome(run, target, window)
        checks.append({"target": target, "metric": metric, "epochs to target": o.epochs,
                       **rcp.columns(rcp.check_outcomes([o], metric, window)["runs"][0])})
    path = rcp.reference_path(config.get("preset"), precision(config))
    return {"reference": path.name if ref else None, "checks": checks,
            "check": None if ref else f"no reference for preset {config.get('preset')!r}",
            "reproduction": run_reproduction(config, env, evals)}  # its first epochs against the reference curve
