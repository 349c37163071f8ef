"""Runs that differ only in seed, aggregated: the verdict between machines rests on several
seeds, not one (MLPerf Training times each benchmark several times; AlgoPerf takes the
median of 5 studies).

A *group* is the runs of one workload, one configuration apart from ``train.seed``, on one
machine (:func:`speechperf.hardware.machine.machine_name`). Per group and target: runs,
runs that reached it, median TTA, MLPerf's olympic mean (mlperf-logging's result
summarizer: drop the fastest and the slowest), min-max and epochs to target per seed.
TTA = epochs to target x minutes per epoch, both shown for every run and group: the
epochs are the recipe's (their spread is the seeds'), the minutes per epoch the hardware's.

A run that never reached a target is a failed run, as in MLPerf, never dropped: it counts
as slower than any TTA (an infinite TTA) in the median and the interval, and as a dropped
score in the olympic mean (MLPerf tolerates one per benchmark: with two or more the group
gets no olympic score, and the row says so). A run that has not finished (running, or
stopped by a fault and resumable) without reaching the target is counted apart as
unfinished and left out of the statistics, saying so.

Between two groups of one workload: TTA(A) / TTA(B) with its exact 95% interval
(:mod:`speechperf.scoring.interval`); when it holds 1 the row says the two are not
distinguishable at these seeds instead of ranking them.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from itertools import combinations

from speechperf.algorithms import algo_config
from speechperf.studies import rcp
from speechperf.studies.precisions import each_at_best, precision
from speechperf.scoring.interval import ratio_interval
from speechperf.scoring.olympic import olympic_mean
from speechperf.scoring.target_rule import epochs_to_target

FINISHED = ("success", "time_cap", "max_epochs")  # statuses of a run that trained to its end


@dataclass(frozen=True)
class SeedRun:
    """One run as aggregation sees it."""

    label: str  # the run's name in tables (unique among the runs shown)
    workload: str  # workload_label: model and parameter count
    machine: str  # machine_name of its env.json
    config: dict  # its configuration (config.json)
    status: str | None  # runs.status: success, time_cap, max_epochs, diverged: ..., failed: ..., running
    evals: tuple  # (TTA clock seconds, error %) per epoch, in epoch order
    corpus: dict = field(default_factory=dict)  # what it trained and validated on (rcp.corpus_of), {} unknown
    reproduction: dict | None = None  # its curve against the reference seed's (studies/curve.py), None: no curve

    @property
    def seed(self):
        return self.config.get("train", {}).get("seed")

    @property
    def precision(self) -> str:
        """The precision it trained in (config.json's: ``auto`` records the one chosen)."""
        return precision(self.config)

    @property
    def preset(self) -> str | None:
        return self.config.get("preset")

    @property
    def group_key(self) -> str:
        """Workload, configuration apart from train.seed, machine: what seeds of one study share."""
        cfg = json.loads(json.dumps(self.config))
        cfg.get("train", {}).pop("seed", None)
        # its own fields: a section holding every algorithm's reads the same
        cfg["algo"] = asdict(algo_config(cfg.get("algo")))
        return json.dumps([self.workload, cfg, self.machine], sort_keys=True)

    @property
    def finished(self) -> bool:
        stop = self.config.get("train", {}).get("stop", {})
        if 0 < (stop.get("after_epochs") or 0) < stop.get("max_epochs", 0) and self.status in FINISHED:
            return False  # cut after its first epochs (a reproduction, drive/reproduce.py): not a failed run
        return self.status in FINISHED or str(self.status or "").startswith("diverged")


@dataclass(frozen=True)
class Outcome:
    """One run against one target: TTA and its two factors."""

    run: SeedRun
    target: float
    epochs: int | None  # epochs to target (None: not reached)
    min_per_epoch: float | None  # minutes of TTA clock per epoch, up to the target (or over the whole run)

    @property
    def minutes(self) -> float | None:
        return None if self.epochs is None else self.run.evals[self.epochs - 1][0] / 60.0

    @property
    def state(self) -> str:
        """reached | never reached (a failed run) | unfinished (not counted yet)."""
        if self.epochs is not None:
            return "reached"
        return "never reached" if self.run.finished else "unfinished"

    @property
    def tta_or_inf(self) -> float:
        return self.minutes if self.minutes is not None else math.inf


def outcome(run: SeedRun, target: float, window: int) -> Outcome:
    """TTA of ``run`` to ``target`` split into epochs x minutes per epoch."""
    epochs = epochs_to_target(run.evals, target, window)
    upto = epochs or len(run.evals)
    per_epoch = run.evals[upto - 1][0] / 60.0 / upto if upto else None
    return Outcome(run, target, epochs, per_epoch)


def groups_of(runs: list[SeedRun]) -> dict[str, list[SeedRun]]:
    """Runs grouped by :attr:`SeedRun.group_key`, named, in order of first appearance."""
    by_key: dict[str, list[SeedRun]] = {}
    for r in runs:
        by_key.setdefault(r.group_key, []).append(r)
    names = [_group_name(members) for members in by_key.values()]
    out = {}
    for k, (name, members) in enumerate(zip(names, by_key.values())):
        out[f"{name} #{names[:k + 1].count(name)}" if names.count(name) > 1 else name] = members
    return out


def _group_name(members: list[SeedRun]) -> str:
    labels = {r.label for r in members}
    if len(labels) == 1:
        return labels.pop()
    first = members[0]
    return " ".join(str(p) for p in (first.machine, first.preset or first.config.get("model", {}).get("name")) if p)


def _median(values: list[float]) -> float | None:
    m = statistics.median(values) if values else math.inf
    return None if math.isinf(m) else m


def group_row(name: str, outcomes: list[Outcome], metric: str, window: int) -> dict:
    """One group against one target: counts, TTA statistics and the two factors."""
    counted = [o for o in outcomes if o.state != "unfinished"]
    reached = sorted(o.minutes for o in counted if o.state == "reached")
    failed = sum(o.state == "never reached" for o in counted)
    score, rule = olympic_mean(reached, failed)
    first = outcomes[0].run
    return {"group": name, "workload": first.workload, "machine": first.machine, "precision": first.precision,
            "metric": metric,
            "target": outcomes[0].target, "epochs": window, "runs": len(outcomes), "reached": len(reached),
            "never reached": failed, "unfinished": len(outcomes) - len(counted),
            "median TTA min": _median([o.tta_or_inf for o in counted]), "olympic TTA min": score, "olympic rule": rule,
            "min TTA min": reached[0] if reached else None, "max TTA min": reached[-1] if reached else None,
            "median epochs to target": _median([o.epochs or math.inf for o in counted]),
            "median min/epoch": _median([o.min_per_epoch for o in outcomes if o.min_per_epoch is not None]),
            "min/epoch max/min": speed_spread(outcomes), "epochs to target per seed": per_seed(outcomes)}


SPEED_SPREAD_NOTE = 1.10  # min/epoch max/min above which a group's TTA spread is flagged as partly the machine's


def speed_spread(outcomes: list[Outcome]) -> float | None:
    """max/min of the seeds' minutes per epoch: the same configuration on the same machine
    should give ~1.0; more says the machine's speed changed between seeds (a shared or
    throttled host), so part of the group's TTA spread is the machine's, not the seeds'."""
    speeds = [o.min_per_epoch for o in outcomes if o.min_per_epoch]
    return max(speeds) / min(speeds) if len(speeds) > 1 else None


def speed_notes(groups: list[dict]) -> list[str]:
    """A line per group whose minutes per epoch varied by more than :data:`SPEED_SPREAD_NOTE`
    between its seeds (the largest over its targets' rows: one line, not one per target)."""
    worst: dict[str, float] = {}
    for g in groups:
        if g.get("min/epoch max/min") is not None:
            worst[g["group"]] = max(worst.get(g["group"], 0.0), g["min/epoch max/min"])
    return [f"{name}: minutes per epoch varied {x:.2f}x between seeds on one machine: its TTA spread is partly the "
            f"machine's speed, not the seeds'; rerun on a quiet machine before ranking on it."
            for name, x in worst.items() if x > SPEED_SPREAD_NOTE]


def per_seed(outcomes: list[Outcome]) -> str:
    """"s1:9 s2:10 s3:never s4:running": epochs to target of each seed, in run order."""
    word = {"never reached": "never", "unfinished": "unfinished"}
    return " ".join(f"s{o.run.seed}:{o.epochs if o.epochs is not None else word[o.state]}" for o in outcomes)


def comparison_row(a: tuple[str, list[Outcome]], b: tuple[str, list[Outcome]]) -> dict:
    """TTA(A) / TTA(B) with its exact 95% interval, the factors' ratios and the verdict."""
    (name_a, oa), (name_b, ob) = a, b
    ca = [o for o in oa if o.state != "unfinished"]
    cb = [o for o in ob if o.state != "unfinished"]
    best = each_at_best([oa[0].run.precision, ob[0].run.precision])  # None: one precision, like for like
    row = {"workload": oa[0].run.workload, "metric": None, "target": oa[0].target, "A": name_a, "B": name_b,
           "precision A": oa[0].run.precision, "precision B": ob[0].run.precision, "precisions": best,
           "seeds A": len(ca), "seeds B": len(cb)}
    if not ca or not cb:
        return {**row, "verdict": "not compared: a group has no finished run"}
    iv = ratio_interval([o.tta_or_inf for o in ca], [o.tta_or_inf for o in cb])
    epochs = _ratio(_median([o.epochs or math.inf for o in ca]), _median([o.epochs or math.inf for o in cb]))
    speed = _ratio(_median([o.min_per_epoch for o in ca if o.min_per_epoch]),
                   _median([o.min_per_epoch for o in cb if o.min_per_epoch]))
    return {**row, "TTA ratio A/B": iv.ratio, "95% low": iv.low, "95% high": iv.high,
            "coverage %": None if iv.coverage is None else 100 * iv.coverage,
            "epochs ratio A/B": epochs, "min/epoch ratio A/B": speed,
            "verdict": verdict(name_a, name_b, iv, len(ca), len(cb), epochs, speed) + (f"; {best}" if best else "")}


def _ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x is not None and y else None


def verdict(name_a: str, name_b: str, iv, na: int, nb: int, epochs: float | None, speed: float | None) -> str:
    """Who is faster, by how much and on which factor; or that these seeds cannot tell."""
    if iv.holds_one:
        why = "" if iv.coverage is not None else " (no exact 95% interval exists at so few seeds)"
        return f"not distinguishable at {na} and {nb} seeds{why}"
    fast, slow, r = (name_a, name_b, 1 / iv.ratio) if iv.high < 1 else (name_b, name_a, iv.ratio)
    factor = ""
    if epochs and speed:
        factor = ("; mostly fewer epochs (recipe and seeds)" if abs(math.log(epochs)) > abs(math.log(speed))
                  else "; mostly faster epochs (hardware)")
    return f"{fast} {r:.3g}x faster than {slow}{factor}"


def _reproduction(run: SeedRun, check: dict) -> dict:
    """The run's curve against its reference's, as a column; a run that could have reproduced
    it and did not fails the RCP check as well."""
    r = run.reproduction
    if r is None:
        return {}
    return {"reproduction": r["text"], **({"RCP check": f"{r['text']}; {check['check']}"} if r.get("flagged") else {})}


def aggregate(runs: list[SeedRun], targets_of, metric: str, window: int) -> tuple[list[dict], list[dict], list[dict]]:
    """(per-run factor rows, group rows, comparison rows) of ``runs`` for the targets
    ``targets_of(run)`` gives (of ``metric``, TTA window ``window``)."""
    run_rows, group_rows, comparisons = [], [], []
    by_workload: dict[str, list[tuple[str, dict[float, list[Outcome]]]]] = {}
    for name, members in groups_of(runs).items():
        per_target = {t: [outcome(r, t, window) for r in members] for t in targets_of(members[0])}
        by_workload.setdefault(members[0].workload, []).append((name, per_target))
        for target, outs in per_target.items():
            checks = rcp.check_outcomes(outs, metric, window)
            run_rows += [{"run": o.run.label, "group": name, "target": target, "state": o.state, "seed": o.run.seed,
                          "epochs to target": o.epochs, "min/epoch": o.min_per_epoch, "minutes": o.minutes,
                          **rcp.columns(c), **_reproduction(o.run, c)} for o, c in zip(outs, checks["runs"])]
            group_rows.append({**group_row(name, outs, metric, window), **rcp.columns(checks["group"])})
    for groups in by_workload.values():
        for (na, ta), (nb, tb) in combinations(groups, 2):
            comparisons += [{**comparison_row((na, ta[t]), (nb, tb[t])), "metric": metric} for t in ta if t in tb]
    return run_rows, group_rows, comparisons
