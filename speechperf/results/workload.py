"""A run's workload: the model it trains and its parameter count, from its configuration.

Runs of different workloads are different jobs (their own computation per step, their own
route to a target), so tables group runs by workload and rank only within one.
"""
from __future__ import annotations

import functools
import json

from speechperf.errors import SpeechperfError

UNRECORDED = "model not recorded"  # a config.json without a model section (runs written by hand, old tests)


def workload(config: dict) -> dict:
    """{"model": name, "params": count} of the model a run's configuration (config.json) trains:
    the run's workload. Runs of different workloads are different jobs, never ranked as one."""
    model = config.get("model")
    if not isinstance(model, dict):
        return {"model": UNRECORDED, "params": None}
    return dict(_describe(json.dumps(model, sort_keys=True)))


@functools.lru_cache(maxsize=64)
def _describe(model_json: str) -> tuple:
    """:func:`speechperf.models.describe` of a model config dict (JSON, for the cache); params
    None for a model this release cannot build (a newer release's model, or its fields; a model
    from outside the package whose module is not on this Python path: named by its NAME)."""
    from speechperf.models import describe
    from speechperf.models.external import registered_name

    model = json.loads(model_json)
    try:
        described = describe(model)
    except SpeechperfError:
        described = {"model": registered_name(str(model.get("name", "ds2"))), "params": None}
    return tuple(described.items())


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
