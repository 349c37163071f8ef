"""Reference convergence points (RCPs): how many epochs a shipped preset takes to reach its
target over many reference seeds, and the check of runs against them, MLPerf's way.

A reference is a JSON file per preset in ``speechperf/config/rcp/`` (written by
``benchmarks/run.py convergence PRESET --seeds N --write``): the recipe it trained (the
configuration apart from the fields in :data:`NOT_RECIPE`), the corpus (train and
validation utterances), the metric and TTA window, and per reference seed its epochs and
minutes to each target, its final error and where, when and how it was measured (commit,
machine, ISA, threads, torch).
A seed may also keep its first epochs' validation curve, bit for bit, with the settings
that reproduce it (``curves``: studies/curve.py, ``speechperf reproduce``).

The statistics are mlperf-logging's RCP checker's (``mlperf_logging.rcp_checker``): the
reference's olympic mean and standard deviation of epochs, and the fewest mean epochs a
submission of k runs may take before a one-sided t-test at its alpha (0.05) says it
converged faster than the reference allows. A run (k = 1) or a group of seeds is flagged
when it converges faster than that, or when it never reaches a target that every reference
seed reached. A preset, recipe or corpus without a reference says so, never passes quietly.
"""
from __future__ import annotations

import dataclasses
import functools
import io
import json
import math
from functools import lru_cache
from pathlib import Path

from speechperf.algorithms import DEFAULT as DEFAULT_ALGO, algo_config
from speechperf.config import SECTIONS, section_kind
from speechperf.config.training.optim_config import IMPLS
from speechperf.config.training.system_config import CTC_KERNELS
from speechperf.errors import SpeechperfError
from speechperf.metric import is_target, targets as target_metrics
from speechperf.models import external
from speechperf.scoring.olympic import olympic_mean
from speechperf.studies.precisions import precision as run_precision
from speechperf.results import upgrade
from speechperf.results.shapes import NUM, OPT_NUM, OPT_STR, ShapeError, check_shape

RCP_DIR = Path(__file__).resolve().parents[1] / "config" / "rcp"
FORMAT = 1  # reference file "format"
# Fields that change how a run is executed or recorded, not what it trains: a run differing
# from the reference only in these is still checked against it.
NOT_RECIPE = frozenset({
    "train.seed", "train.system.threads", "train.stop.time_cap_minutes", "train.stop.after_epochs",
    "train.system.device", "train.system.dist_backend", "train.system.sync_every", "train.system.checkpoint_every",
    "train.eval.sentence_every", "train.system.compile", "train.system.cuda_graphs", "train.system.graph_frames",
    "train.system.graph_batch", "train.floor.steps", "train.floor.window", "train.optim.impl", "train.system.ctc_kernel",
    "train.system.deterministic", "train.stop.max_bad_losses", "train.stop.max_skipped_fraction",
    "train.eval.final_splits", "train.eval.final_beam",
    "train.stop.target", "loader.readers", "loader.prefetch_batches", "loader.resident"})  # train.stop.target: where it
    # stops, not how it trains
# mlperf-logging's checker knows MLPerf's benchmarks only: a speechperf reference is handed to
# it as one of its speech benchmark (RNN-T), whose submission run count the wrapper replaces.
BENCHMARK, RULESET = "rnnt", "6.0.0"
OK, FASTER, FAILED = "ok", "faster than the reference allows", "never reached; every reference seed did"
# The reference's olympic mean drops its fastest and slowest seed: its standard deviation needs two seeds
# left. With 3 (one left) mlperf-logging's checker divides by zero and its bound is the one seed's epochs,
# which flagged a run as fast at the epochs a reference seed itself took; so no verdict from fewer than 4.
MIN_REFERENCE_SEEDS = 4


# What a reference curve holds per epoch (studies/curve.py): the loss and every target metric of
# speechperf/metric.py; a curve measured before a metric existed lacks it (and is not compared on it).
CURVE_METRICS = ("loss", *target_metrics())
# The shape of a reference file (results/shapes.py's specs): what the checks below read; the
# values are checked after it (_check_values).
CURVE = {"epochs": [{"epoch": int, **{m: NUM for m in CURVE_METRICS}}], "settings": {"*": (str, int, type(None))},
         "overrides": [str], "corpus": dict, "measured": (dict, type(None))}
REFERENCE = {"format": int, "preset": OPT_STR, "metric": OPT_STR, "window": OPT_NUM, "targets": [NUM],
             "recipe": {"*": (str, int, float, bool, type(None), list)}, "overrides": [str],
             "corpus": {"fingerprint": {"*": OPT_NUM}, "data": OPT_STR, "synth": (dict, type(None))}, "how": OPT_STR,
             "seeds": [{"seed": OPT_NUM, "status": OPT_STR, "epochs": {"*": OPT_NUM}, "margin": {"*": OPT_NUM},
                        "minutes": {"*": OPT_NUM}, "final_cer": OPT_NUM, "epochs_trained": OPT_NUM,
                        "measured": (dict, type(None)), "curves": [CURVE]}]}


class ReferenceError(SpeechperfError):
    """A reference file that cannot be read as one (names the file)."""


def reference_path(preset: str | None, precision: str | None = None) -> Path | None:
    """A preset's reference in one precision: fp32's is ``PRESET.json`` (every reference measured before
    ``train.system.precision=auto``), another's ``PRESET.PRECISION.json`` (``cpu.bf16.json``): a run is checked
    against the seeds trained in its own precision, never another's epochs. An unresolved ``auto`` (a
    config never trained: a run records the precision chosen) reads the base file, whose recipe decides."""
    if not preset:
        return None
    base = precision in (None, "fp32", "auto")
    return RCP_DIR / (f"{preset}.json" if base else f"{preset}.{precision}.json")


def load_reference(preset: str | None, precision: str | None = None) -> dict | None:
    """The reference of ``preset`` in ``precision`` (None: fp32), None when it has none; a damaged file is
    refused by name."""
    path = reference_path(preset, precision)
    if path is None or not path.is_file():
        return None
    return _read(str(path), path.stat().st_mtime_ns)


@lru_cache(maxsize=16)
def _read(path: str, _mtime: int) -> dict:
    try:
        ref = json.loads(Path(path).read_text())
        if not isinstance(ref, dict) or ref.get("format") != FORMAT or not isinstance(ref.get("seeds"), list):
            raise ValueError(f"not a reference of format {FORMAT} with a list of seeds")
    except (OSError, ValueError) as e:
        raise ReferenceError(f"reference convergence points {path}: unreadable ({e})") from None
    except RecursionError:  # nested deeper than the parser's recursion
        raise ReferenceError(f"reference convergence points {path}: unreadable (nested too deeply)") from None
    where = f"reference convergence points {path}"
    try:  # valid JSON of the wrong shape ("recipe": "abc"): refused by field, not a traceback in a table
        check_shape(ref, REFERENCE, where)
    except ShapeError as e:
        raise ReferenceError(str(e)) from None
    _check_values(ref, where)
    return ref


def _check_values(ref: dict, where: str) -> None:
    """The values the shape cannot say: a declared target metric, a window of epochs, error-rate
    targets, epochs and curves that a check or ``reproduce`` can compare with; the first
    field that is not is refused by name (a broken reference must not read as a run's fault)."""
    bad = functools.partial(_refuse, where)
    if ref.get("metric") not in target_metrics():
        bad("metric", ref.get("metric"), f"one of {', '.join(target_metrics())}")
    if not _count(ref.get("window"), 1):
        bad("window", ref.get("window"), "a whole number of epochs >= 1")
    targets = ref.get("targets")
    if not targets:
        bad("targets", targets, "a list of error rates in (0, 100] %")
    for i, t in enumerate(targets):
        if not is_target(t):
            bad(f"targets[{i}]", t, "an error rate in (0, 100] %")
    for i, seed in enumerate(ref["seeds"]):
        _check_seed(seed, f"seeds[{i}]", where)


def _check_seed(seed: dict, field: str, where: str) -> None:
    bad = functools.partial(_refuse, where)
    if not _count(seed.get("seed"), 0):
        bad(f"{field}.seed", seed.get("seed"), "a whole number")
    for key in ("epochs", "margin", "minutes"):
        for target, value in (seed.get(key) or {}).items():
            if not _target_key(target):
                bad(f"{field}.{key}", target, "keyed by targets written as numbers")
            ok = _count(value, 1) if key == "epochs" else _finite(value) and (key == "margin" or value >= 0)
            if value is not None and not ok:
                bad(f"{field}.{key}.{target}", value, "a whole number of epochs >= 1" if key == "epochs" else
                    "a finite number" + ("" if key == "margin" else " >= 0"))
    for key, want in (("final_cer", "a finite error rate >= 0"), ("epochs_trained", "a whole number >= 0")):
        value = seed.get(key)
        if value is not None and not (_count(value, 0) if key == "epochs_trained" else _finite(value) and value >= 0):
            bad(f"{field}.{key}", value, want)
    for c, curve in enumerate(seed.get("curves") or []):
        _check_curve(curve, f"{field}.curves[{c}]", where)


def _check_curve(curve: dict, field: str, where: str) -> None:
    """A curve is compared epoch by epoch from epoch 1, bit for bit, on the settings it names."""
    bad = functools.partial(_refuse, where)
    for key in ("epochs", "settings"):
        if key not in curve:
            bad(field, sorted(curve), f"an object with {key!r}")
    if not curve["epochs"]:
        bad(f"{field}.epochs", [], "a list of epochs from epoch 1")
    for e, row in enumerate(curve["epochs"]):
        if row.get("epoch") != e + 1:
            bad(f"{field}.epochs[{e}].epoch", row.get("epoch"), f"{e + 1} (epochs in order from 1)")
        if not any(m in row for m in CURVE_METRICS[1:]):
            bad(f"{field}.epochs[{e}]", sorted(row), f"an epoch with the loss and a target metric "
                                                     f"({', '.join(CURVE_METRICS[1:])})")
        for m in (m for m in CURVE_METRICS if m == "loss" or m in row):
            if not (_finite(row.get(m)) and row[m] >= 0):
                bad(f"{field}.epochs[{e}].{m}", row.get(m), "a finite number >= 0")
    for key in ("features_sha256", "torch"):
        if not isinstance(curve["settings"].get(key), str):
            bad(f"{field}.settings.{key}", curve["settings"].get(key), "a string")
    if curve["settings"].get("seed") is not None and not _count(curve["settings"]["seed"], 0):
        bad(f"{field}.settings.seed", curve["settings"]["seed"], "a whole number")
    if curve["settings"].get("threads") is not None and not _count(curve["settings"]["threads"], 1):
        bad(f"{field}.settings.threads", curve["settings"]["threads"], "a whole number of threads >= 1")
    for key, allowed in (("optim_impl", IMPLS), ("ctc_kernel", CTC_KERNELS)):  # reproduce passes them to train:
        value = curve["settings"].get(key)  # checked here, naming the file
        if value is not None and value not in allowed:
            bad(f"{field}.settings.{key}", value, f"one of {', '.join(allowed)}")


def _refuse(where: str, field: str, value, want: str):
    raise ReferenceError(f"{where}: field {field!r} should be {want}, found {value!r}")


def _count(value, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _target_key(key: str) -> bool:
    try:
        return is_target(float(key))
    except ValueError:
        return False


def recipe(config: dict) -> dict:
    """The configuration as dotted keys (train's sections walked: ``train.optim.lr``), less the
    fields that do not change what is trained."""
    flat = {}
    for section, values in config.items():
        if isinstance(values, dict):
            flat.update({k: v for k, v in _dotted(values, section).items() if k not in NOT_RECIPE})
        elif section != "preset":
            flat[section] = values
    return flat


def _dotted(values: dict, prefix: str) -> dict:
    out = {}
    for k, v in values.items():
        out.update(_dotted(v, f"{prefix}.{k}") if isinstance(v, dict) else {f"{prefix}.{k}": v})
    return out


def _completed(flat: dict) -> dict:
    """``flat`` (a recipe) with every field it lacks at this code's default: a run or
    reference recorded before a field existed (the [algo] section, train.schedule.lr_step_epochs)
    trained with its default. A recipe naming a field this code does not know stays as it is
    (and differs)."""
    named = {"model": {"name": flat.get("model.name", "ds2")}, "algo": {"name": flat.get("algo.name", DEFAULT_ALGO)}}
    defaults = {}
    for section in SECTIONS:
        try:
            with external.reading("a recorded recipe"):  # a run's or a reference's: its MODULE:NAME never imported
                defaults[section] = dataclasses.asdict(section_kind(section, named)())
        except ValueError:  # a model or algorithm this code does not know (UnknownName, ConfigError): as recorded
            pass
    return {**recipe(defaults), **_own_algo_fields(flat)}


def _own_algo_fields(flat: dict) -> dict:
    """``flat`` with its ``algo.*`` keys those of the named algorithm's config: a recipe holding
    every algorithm's fields (this release's config.json) reads as the one naming its own
    (speechperf/algorithms' ``algo_config``); one it refuses stays as recorded (and differs)."""
    algo = {k.split(".", 1)[1]: v for k, v in flat.items() if k.startswith("algo.")}
    try:
        own = dataclasses.asdict(algo_config(algo))
    except ValueError:
        return flat
    return {**{k: v for k, v in flat.items() if not k.startswith("algo.")},
            **{f"algo.{k}": v for k, v in own.items() if f"algo.{k}" in flat}}


def epochs_of(ref: dict, target: float) -> list[int | None]:
    """The reference seeds' epochs to ``target`` (None: that seed never reached it)."""
    return [s.get("epochs", {}).get(_key(target)) for s in ref["seeds"]]


def _key(target: float) -> str:
    return f"{float(target):g}"


def applies(ref: dict | None, preset: str | None, config: dict, corpus: dict, metric: str, window: int,
            target: float) -> str | None:
    """None when ``ref`` covers a run of this configuration, corpus and target; else why not."""
    if ref is None:
        numerics = run_precision(config)
        # a bf16 run is never checked against fp32's epochs
        kind = "" if numerics in ("fp32", "auto") else f"{numerics} "
        return f"no {kind}reference for preset {preset!r}" if preset else "no reference: the run names no preset"
    if (ref.get("metric"), ref.get("window")) != (metric, window):
        return f"reference is of {str(ref.get('metric')).upper()} over {ref.get('window')} epochs"
    # a reference's recipe of an earlier release names train's flat keys (train.lr): read as this release's
    mine, theirs = _completed(recipe(config)), _completed(upgrade.recipe(ref.get("recipe", {})))
    differ = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
    if differ:
        shown = ", ".join(f"{k}={mine.get(k)!r} (reference {theirs.get(k)!r})" for k in differ[:3])
        return f"reference is for another recipe: {shown}" + (f" and {len(differ) - 3} more" if len(differ) > 3 else "")
    if corpus != ref.get("corpus", {}).get("fingerprint"):
        return (f"reference measured on another corpus ({ref.get('corpus', {}).get('fingerprint')}; "
                f"this run: {corpus or 'not recorded'})")
    if not any(e is not None for e in epochs_of(ref, target)):
        return f"reference has no seed that reached {target:g}"
    return None


def _checker(epochs: tuple[int, ...], runs: int):
    """mlperf-logging's RCP checker over the reference ``epochs``, for a submission whose mean
    counts ``runs`` runs (its t-test's sample size)."""
    from mlperf_logging.rcp_checker import rcp_checker  # heavy: pulls pandas and its rules

    class Checker(rcp_checker.RCP_Checker):
        # the library reads the run count from its table of MLPerf benchmarks; ours is the group's
        submission_runs = property(lambda self: runs + 2, lambda self, _value: None)

    record = {"speechperf": {"Benchmark": BENCHMARK, "BS": 0, "Hyperparams": {}, "Epochs to converge": list(epochs)}}
    return Checker("training", RULESET, BENCHMARK, False, rcp_file=io.StringIO(json.dumps(record)))


@lru_cache(maxsize=256)
def limits(epochs: tuple[int, ...], runs: int) -> dict:
    """{"RCP mean", "RCP stdev", "min epochs"}: the reference's olympic mean and standard
    deviation, and the fewest mean epochs of ``runs`` runs it accepts (mlperf-logging)."""
    record = next(iter(_checker(epochs, runs).rcp_data.values()))
    return {"RCP mean": float(record["RCP Mean"]), "RCP stdev": float(record["RCP Stdev"]),
            "min epochs": float(record["Min Epochs"])}


def check(ref: dict, target: float, reached: list[int], failed: int) -> dict:
    """Runs against the reference at ``target``: ``reached``, their epochs to it; ``failed``,
    how many finished without reaching it. The mean is MLPerf's olympic one from 3 runs on
    (a failed run is the dropped slowest), the plain mean below 3 (nothing to drop)."""
    ref_epochs = epochs_of(ref, target)
    converged = tuple(sorted(e for e in ref_epochs if e is not None))
    if len(converged) < MIN_REFERENCE_SEEDS:
        return {"check": f"reference too small: {len(converged)} seeds reached {target:g} "
                         f"({MIN_REFERENCE_SEEDS} needed)"}
    out = {"reference": f"{len(converged)}/{len(ref_epochs)} seeds, epochs {converged[0]}-{converged[-1]}"}
    n = len(reached) + failed
    if failed and len(converged) == len(ref_epochs):
        return {**out, "check": FAILED if n == 1 else f"{failed} of {n} {FAILED}"}
    if not reached:
        return {**out, "check": f"never reached, as {len(ref_epochs) - len(converged)} of the reference seeds"}
    mean = olympic_mean([float(e) for e in reached], failed)[0] if n >= 3 else sum(reached) / len(reached)
    if mean is None:
        return {**out, "check": f"{failed} runs never reached"}
    lim = limits(converged, max(n - 2, 1) if n >= 3 else len(reached))
    verdict = OK if mean >= lim["min epochs"] else FASTER
    return {**out, **lim, "mean epochs": mean, "check": verdict}


def check_outcomes(outcomes: list, metric: str, window: int) -> dict:
    """{"runs": a check per outcome, "group": the check of them together} at one target."""
    first = outcomes[0].run
    ref = load_reference(first.preset, run_precision(first.config))
    why = applies(ref, first.preset, first.config, first.corpus, metric, window, outcomes[0].target)
    if why is not None:
        return {"runs": [{"check": why} for _ in outcomes], "group": {"check": why}}
    target = outcomes[0].target
    runs = [check(ref, target, [o.epochs] if o.epochs else [], int(o.state == "never reached"))
            if o.state != "unfinished" else {"check": "unfinished"} for o in outcomes]
    counted = [o for o in outcomes if o.state != "unfinished"]
    group = check(ref, target, [o.epochs for o in counted if o.epochs],
                  sum(o.state == "never reached" for o in counted))
    return {"runs": runs, "group": group}


def columns(c: dict) -> dict:
    """A check as table columns."""
    return {"reference epochs": c.get("reference"), "min epochs allowed": c.get("min epochs"), "RCP check": c["check"]}


def corpus_of(events_log: Path) -> dict:
    """{"train_utterances", "eval_utterances"} from a run's events.log (its train_samples and
    eval_samples lines); {} when the log has neither."""
    found = {}
    keys = {"train_samples": "train_utterances", "eval_samples": "eval_utterances"}
    try:
        with open(events_log, encoding="utf-8") as f:
            for line in f:
                if '"train_samples"' in line or '"eval_samples"' in line:
                    event = json.loads(line.split(":::MLLOG ", 1)[1])
                    if event.get("key") in keys:
                        found[keys[event["key"]]] = event.get("value")
                if len(found) == 2:
                    break
    except (OSError, ValueError, IndexError):
        return {}
    return found
