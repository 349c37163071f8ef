"""Tables that combine runs: time to accuracy (Table 4/6) and price/performance per platform
(repeated runs over seeds: speechperf/studies/aggregate.py)."""
from __future__ import annotations

from speechperf.metric import DEFAULT_TARGET, measured
from speechperf.studies.busy import busy, busy_text
from speechperf.studies.precisions import label as precision_label
from speechperf.studies.time_parts import decoding, shares, step_vs_floor, time_parts
from speechperf.scoring.target_rule import relative_pct, tta_minutes
from speechperf.scoring.targets import METRICS, Targets
from speechperf.telemetry import contention, energy
from speechperf.studies.report.runs import who
from speechperf.hardware.platforms import Platform, load, of_run, price_columns, price_performance

# The paper's TTA to dev-clean CER 10 on LibriSpeech (docs/spec.md D), for orientation beside ours.
PAPER_TTA_CER10 = {"sys1": 820.0, "sys2": 672.0, "sys10": 511.0}


def run_tta(run: dict, target: float = 10.0, metric: str = DEFAULT_TARGET) -> float | None:
    return tta_minutes([(e["clock_s"], e[metric]) for e in run["evals"]], target, 3)


def energy_by_source(run: dict, seconds: float) -> dict[str, tuple[float, str]]:
    """{source: (joules in the first ``seconds`` of the run, "counter" | "integrated-power")} of the
    top-level sources (telemetry/energy.py: counter where a source has one, else integrated power)."""
    return energy.by_source(run["samples"], seconds, top_only=True)


def energy_until(run: dict, seconds: float | None) -> float | None:
    """Energy to accuracy (telemetry/energy.py's one rule, as ``tta`` reads it): joules of all
    sources in the first ``seconds`` of the run; None when nothing measured it."""
    return energy.to_accuracy(run["samples"], seconds, run.get("label", "the run"))


BUSY_COLUMNS = ("device", "tta %", "tta samples", "training %", "training samples", "eval %", "eval samples")
DECODE_COLUMNS = ("threads", "frames per thread-s", "core share %")  # studies/time_parts.py's decoding


def time_rows(runs: list[dict], target: float = 10.0) -> list[dict]:
    """Where each run's time to CER ``target`` went (studies/time_parts.py), or its time to its
    last evaluation where it never reached the target; seconds and the parts' shares; and how
    busy its accelerator was over that time, in its training phases and its evaluations
    (studies/busy.py: ``busy`` in short, ``busy ...`` each figure); how its evaluations decoded
    (``decode ...``: threads, rate, the share of a core they had; empty where the rows hold none); and
    its step against its floor where it measured one after training (train/floor.py)."""
    rows = []
    for r in runs:
        tta = run_tta(r, target)
        until = tta * 60 if tta is not None else max((e["clock_s"] for e in r["evals"]), default=None)
        if until is None:
            continue
        parts = time_parts(r["iterations"], r["evals"], until)
        shown = busy(r["samples"], r["iterations"], r["evals"], until, r["env"].get("device"))
        decoded = decoding(r["evals"], until) or {}
        rows.append({**who(r), "to": f"CER {target:g}" if tta is not None else "last evaluation (target not reached)",
                     **{k: v for k, v in parts.items() if k != "note"}, "shares": shares(parts), "note": parts["note"],
                     "busy": busy_text(shown), **{f"busy {k}": shown[k] for k in BUSY_COLUMNS},
                     "busy note": shown["note"],
                     **{f"decode {k}": decoded.get(k) for k in DECODE_COLUMNS},
                     **floor_columns(r.get("summary")), "step vs floor": step_vs_floor(r.get("summary")),
                     **shared_column(r, until)})
    return rows


def floor_columns(summary: dict | None) -> dict:
    """The step against its floor (train/floor.py): its median loop/floor and 10th-90th percentiles."""
    floor = (summary or {}).get("floor") or {}
    return {"loop/floor": floor.get("loop_over_floor"), "loop/floor p10": floor.get("loop_over_floor_p10"),
            "loop/floor p90": floor.get("loop_over_floor_p90")}


def shared_column(r: dict, until: float | None) -> dict:
    """``shared``: whether other processes took cores the run needed up to ``until``
    (telemetry/contention.py: ``yes 34%``, ``no``; empty where the run did not record it)."""
    return {"shared": contention.short(contention.shared(r["samples"], r["env"].get("torch_threads"),
                                                         r["env"].get("cpu_cores_logical"), until))}


def cheapest_first(platform: Platform) -> tuple:
    """Sort key: purchase price, then $/hour, then unpriced machines."""
    if platform.price_usd is not None:
        return (0, platform.price_usd)
    return (1, platform.usd_per_hour) if platform.usd_per_hour is not None else (2, 0.0)


def tta_rows(runs: list[dict], targets: Targets = Targets()) -> list[dict]:
    """Table 4/6 for the runs of one workload: TTA per run and target, and relative to the run
    on the cheapest platform that reached it (the fastest run when no platform has a price; the
    row names its reference). ``targets``: the set (or numbers) whose targets apply."""
    rows = []
    for metric in METRICS:
        for target in sorted({t for r in runs for t in targets.of(metric, r["workload"]["model"])}, reverse=True):
            mins = [(r, run_tta(r, target, metric)) for r in runs if not r["evals"] or measured(r["evals"], metric)]
            reached = [(r, m) for r, m in mins if m is not None]
            ref = min(reached, key=lambda rm: (cheapest_first(of_run(rm[0]["env"])), rm[1]), default=(None, None))
            for r, m in mins:
                rows.append({**who(r), "precision": precision_label(r["config"], r["env"]),
                             "platform": of_run(r["env"]).name, "metric": metric.upper(),
                             "target %": target, "TTA minutes": m,
                             **shared_column(r, m * 60 if m is not None else None),
                             "relative %": relative_pct(m, ref[1]),
                             "reference": ref[0]["label"] if ref[0] else None})
    return rows


def price_rows(runs: list[dict], target: float = 10.0) -> list[dict]:
    """TTA x price, cost at $/hour and energy to accuracy per run (to CER ``target``), then the
    paper's platforms with the paper's TTA (LibriSpeech: a far larger job than ours)."""
    rows = []
    for r in runs:
        tta = run_tta(r, target)
        joules = energy_until(r, tta * 60 if tta is not None else None)
        price = price_columns(r["env"], tta, joules)
        if tta is not None and joules is None:  # no sample measured energy or power: say why
            price["price note"] = energy.explained(price["price note"], r["env"])
        rows.append({**who(r), **price})
    for name, tta in PAPER_TTA_CER10.items():
        plat = load(name)
        rows.append({"run": "paper, LibriSpeech", "workload": "ds2 (the paper's sizes)", "platform": plat.name,
                     "price $": plat.price_usd, "$/hour": None,
                     "price date": plat.price_date, **price_performance(tta, plat)})
    return rows
