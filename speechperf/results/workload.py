"""A run's workload: the model it trains and its parameter count, recorded in run.json when the
run is made (read back without importing anything), else from its configuration.

Runs of different workloads are different jobs (their own computation per step, their own
route to a target), so tables group runs by workload and rank only within one.
"""
from __future__ import annotations

import functools
import json

from speechperf.errors import SpeechperfError

UNRECORDED = "model not recorded"  # a config.json without a model section (runs written by hand, old tests)


def workload(config: dict, recorded: dict | None = None) -> dict:
    """{"model": name, "params": count} of the model a run trains: the run's workload. Runs of
    different workloads are different jobs, never ranked as one. ``recorded``: what the run
    recorded when it was made (run.json's ``workload``, :func:`described`), the answer wherever
    it is there; else (a run recorded before it was, a preset) from ``config`` (config.json) for
    a built-in model, and the name alone, its parameters None (unknown), for any other: a reader
    never imports a module a folder names (docs/reliability.md)."""
    if isinstance(recorded, dict) and isinstance(recorded.get("model"), str):
        return {"model": recorded["model"], "params": recorded.get("params")}
    model = config.get("model")
    if not isinstance(model, dict):
        return {"model": UNRECORDED, "params": None}
    return dict(_describe(json.dumps(model, sort_keys=True)))


def described(config: dict) -> dict:
    """The workload of a run being made (for run.json, what every later reader shows): its model
    built on the meta device, the model's module imported by the run that trains it (a model from
    outside the package too); params None where this release cannot build it."""
    from speechperf.models import describe  # torch: only where a run is made or a model described
    from speechperf.models.external import registered_name  # torch, as describe

    model = config.get("model")
    if not isinstance(model, dict):
        return {"model": UNRECORDED, "params": None}
    try:
        return describe(model)
    except SpeechperfError:
        return {"model": registered_name(str(model.get("name", "ds2"))), "params": None}


@functools.lru_cache(maxsize=64)
def _describe(model_json: str) -> tuple:
    """:func:`speechperf.models.describe_builtin` of a model config dict (JSON, for the cache);
    params None for a model not built in (a module outside the package, an installed entry
    point's: named by its NAME, nothing imported) or one this release cannot build (a newer
    release's model, or its fields)."""
    from speechperf.models import describe_builtin  # torch: only where a model is described
    from speechperf.models.external import registered_name  # torch, as describe_builtin

    model = json.loads(model_json)
    try:
        described = describe_builtin(model)
    except SpeechperfError:
        described = None
    return tuple((described or {"model": registered_name(str(model.get("name", "ds2"))), "params": None}).items())


def workload_label(w: dict) -> str:
    """"ds2, 2.31 M params": the workload beside a run's label in every table and figure."""
    return w["model"] if w.get("params") is None else f"{w['model']}, {w['params'] / 1e6:.3g} M params"


def by_workload(items: list, workload_of) -> dict[str, list]:
    """``items`` grouped by :func:`workload_label` of ``workload_of(item)``, in order of first
    appearance: the groups that TTA tables rank within (never across)."""
    groups: dict[str, list] = {}
    for item in items:
        groups.setdefault(workload_label(workload_of(item)), []).append(item)
    return groups
