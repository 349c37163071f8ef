"""Time-to-accuracy (docs/spec.md D): TTA(a, e), minutes of the TTA clock (from run_start, after
initialization) until the median of the last e per-epoch evaluations first reaches the target a;
None (NA) when never."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from speechperf.errors import SpeechperfError
from speechperf.metric import DEFAULT_TARGET, measured, metric as metric_of, per_epoch
from speechperf.studies.busy import busy, busy_text
from speechperf.studies.precisions import chosen_by, precision, precision_notes
from speechperf.studies.time_parts import decoding, floor_short, shares, step_vs_floor, time_parts
from speechperf.scoring.target_rule import epochs_to_target, relative_pct, tta_minutes
from speechperf.scoring.targets import parse_targets
from speechperf.results.labels import unique_labels
from speechperf.results.view import RunView
from speechperf.telemetry import contention, energy
from speechperf.hardware.machine import machine_name
from speechperf.results.workload import by_workload


def epoch_rows(run) -> list[dict]:
    """Per-epoch validation rows of an open :class:`~speechperf.results.view.RunView`, in epoch order; a
    run whose rows are not in its database, or only some of them, is an error, never an empty or short list."""
    run.rows.row()
    run.check_rows()
    return run.rows.evals()


def tta_table(runs: Sequence[Path], metric: str = DEFAULT_TARGET, targets="paper", epochs: int = 3,
              price_per_hour: float | None = None, platform_file: Path | None = None) -> list[dict]:
    """Table 4 form: one row per (run, target) with minutes and % of the first run of the same
    workload (the reference), the initialization seconds kept outside the clock, the achieved
    TFLOPS and MFU of its training steps (hardware/mfu.py) with the peak behind it, and the run's
    platform with cost to accuracy and TTA x price (``price_per_hour``/``platform_file``
    override what the run recorded; :func:`speechperf.hardware.platforms.of_run`).

    ``targets``: a target set (``paper``, ``algoperf``: its targets depend on the run's model;
    refused for a run of another protocol) or numbers
    (:func:`speechperf.scoring.targets.parse_targets`). Rows are grouped per
    workload (model and parameter count): runs of different models are different jobs, so a
    run's relative % is only ever against a run of its own workload. Runs are named by their
    labels (told apart where they collide); each run's rows come from its own folder, so
    folders from different machines compare in one table.
    """
    spec = parse_targets(targets, metric)
    opened = [RunView.open(Path(r)) for r in runs]
    try:
        labelled = list(zip(opened, unique_labels(opened), (r.workload for r in opened)))
        for run, label, _ in labelled:  # a named set only for runs of its protocol, before any row
            spec.check_run(run.config, label)
        return [row for name, members in by_workload(labelled, lambda m: m[2]).items()
                for row in _workload_rows(members, name, metric, spec, epochs, price_per_hour, platform_file)]
    finally:
        for run in opened:
            run.close()


def _workload_rows(members: list, name: str, metric: str, spec, epochs: int, price_per_hour,
                   platform_file) -> list[dict]:
    """The rows of the runs of one workload; relative % against the first of them."""
    # these load torch (mfu; platforms through config): reading the runs does not
    from speechperf.hardware.mfu import mfu_columns
    from speechperf.hardware.platforms import price_columns, with_price_overrides

    rows: list[dict] = []
    first: dict[float, float | None] = {}
    for run, label, wl in members:
        targets = spec.require(metric, wl["model"])
        rows_of_epochs = epoch_rows(run)
        if rows_of_epochs and not measured(rows_of_epochs, metric):  # None in every row: results/upgrade.py
            raise SpeechperfError(f"run {label!r} did not measure {metric_of(metric).label} (its evaluations were "
                                  f"recorded before speechperf did): no TTA of it; choose another --metric")
        evals = [(e["clock_s"], e[metric]) for e in rows_of_epochs]
        env = with_price_overrides(run.env, price_per_hour, platform_file)
        summary = run.summary() or {}  # {}: unfinished
        init_s = summary.get("init_s")
        samples, iterations = run.rows.samples(), run.rows.iterations()
        for target in targets:
            minutes = tta_minutes(evals, target, epochs)
            reached = epochs_to_target(evals, target, epochs)
            ref = first.setdefault(target, minutes)
            relative = relative_pct(minutes, ref)
            joules = energy.to_accuracy(samples, None if minutes is None else minutes * 60, label)
            price = price_columns(env, minutes, joules)
            if minutes is not None and joules is None:  # no sample measured energy or power: say why
                price["price note"] = energy.explained(price["price note"], run.env)
            rows.append({"run": label, "workload": name, "machine": machine_name(run.env),
                         "precision": precision(run.config), "precision by": chosen_by(run.env), "metric": metric,
                         "target": target, "median of": epochs, "epochs to target": reached, "minutes": minutes,
                         "relative": relative,
                         **at_target(rows_of_epochs[reached - 1] if reached else None, metric), "init s": init_s,
                         **mfu_columns(summary), **price,
                         **time_columns(iterations, rows_of_epochs, minutes, samples, run.env.get("device"), summary),
                         **shared_columns(samples, run.env, until_s(rows_of_epochs, minutes))})
    return rows


def time_columns(iterations: list[dict], evals: list[dict], minutes: float | None, samples: list[dict],
                 device: str | None, summary: dict | None = None) -> dict:
    """Where the time went (studies/time_parts.py) up to the TTA, or up to the run's last
    evaluation when the target was not reached; how busy the accelerator was in it
    (studies/busy.py: ``busy``, its short form at the end of ``time parts``); how its
    evaluations decoded (``decode``: threads, rate, the share of a core they had); and the step
    against its floor where the run measured it after training (``step vs floor`` in words, ``step
    floor`` its figures: train/floor.py; the ratio also ends ``time parts``). ``device``: the run's
    recorded one (env.json); ``summary``: its summary.json ({} or None: unfinished)."""
    until = until_s(evals, minutes)
    floor = {"step vs floor": step_vs_floor(summary), "step floor": (summary or {}).get("floor")}
    if until is None:
        return {"time parts": None, "time parts s": None, "busy": None, "decode": None, **floor}
    parts = time_parts(iterations, evals, until)
    shown = busy(samples, iterations, evals, until, device)
    text = shares(parts) + ("" if minutes is not None else " (to the last evaluation: target not reached)")
    return {"time parts": text + (f"; {parts['note']}" if parts["note"] else "") + f"; {busy_text(shown)}"
            + floor_short(summary), "time parts s": parts, "busy": shown, "decode": decoding(evals, until), **floor}


def shared_columns(samples: list[dict], env: dict, until: float | None) -> dict:
    """Whether other processes took cores the run needed up to ``until`` (its TTA, else its last
    evaluation; telemetry/contention.py): ``shared`` the short flag beside the minutes (``yes 34%``,
    ``no``; None: not recorded), ``shared machine`` its figures, ``shared note`` in words."""
    figures = contention.shared(samples, env.get("torch_threads"), env.get("cpu_cores_logical"), until)
    return {"shared": contention.short(figures), "shared machine": figures, "shared note": contention.words(figures)}


def until_s(evals: list[dict], minutes: float | None) -> float | None:
    """The clock the breakdown runs to: the TTA moment, else the run's last evaluation (None: none)."""
    return minutes * 60 if minutes is not None else max((e["clock_s"] for e in evals), default=None)


def at_target(row: dict | None, metric: str) -> dict:
    """The evaluation at which the target was declared: its error and 95% interval over the
    validation utterances (scoring/bootstrap.py; None where the row holds none, or when the
    target was never reached). A target crossed inside that interval is crossed by the
    validation set's resolution as much as by the model."""
    row = row or {}
    return {"error at TTA": row.get(metric), "error 95% low": row.get(f"{metric}_lo"),
            "error 95% high": row.get(f"{metric}_hi")}


def evaluations(run, label: str) -> list[dict]:
    """Per-epoch validation rows of an open run, each per-epoch metric (speechperf/metric.py) with
    its 95% interval (None where the row predates the interval or the metric: not measured):
    what ``tta --json`` shows per run."""
    keys = [k for m in per_epoch() for k in m.columns]
    return [{"run": label, "epoch": e["epoch"], "clock_s": e["clock_s"], "split": e["split"],
             **{k: e.get(k) for k in keys}, "n_utts": e["n_utts"]} for e in run.rows.evals()]


def notes(rows: list[dict]) -> list[str]:
    """What the text table leaves implicit: with runs of several workloads, that they are not
    ranked against each other; with runs of one workload in different precisions, that
    'relative' compares each at its best (studies/precisions.py)."""
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    lines = precision_notes(rows)
    if len(workloads) < 2:
        return lines
    return [f"{len(workloads)} workloads ({'; '.join(workloads)}): different jobs, not ranked against each other; "
            "'relative' is % of the first run of the same workload.", *lines]

