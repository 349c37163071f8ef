"""The names runs carry in tables and legends: the default label of a run (machine, preset,
precision, data-parallel algorithm) and labels made unique over several runs."""
from __future__ import annotations

from speechperf.hardware.machine import machine_name


def default_label(env: dict, config: dict) -> str:
    """"H100x1 paper bf16", "2-core Xeon cpu fp32", "2-core Xeon tiny fp32 bmuf/20 x2": machine,
    preset, precision and, for several processes or another algorithm than sync, the
    data-parallel algorithm (its sync_every for local SGD) and the process count."""
    train, algo = config.get("train", {}), config.get("algo")
    precision = (train.get("system") or {}).get("precision")
    parts = [machine_name(env), config.get("preset"), precision or config.get("model"),
             _algorithm_part(algo, env.get("world_size") or 1)]
    return " ".join(str(p) for p in parts if p)


def _algorithm_part(algo, world: int) -> str | None:
    """"bmuf/20 x2", "sync x4"; None for one process of sync or single."""
    if not isinstance(algo, dict):
        return None
    name = algo.get("name", "sync")
    if name in ("sync", "single") and world == 1:
        return None
    every = f"/{algo.get('sync_every', 1)}" if name not in ("sync", "single", "fsdp") else ""
    return f"{name}{every} x{world}"


def unique_labels(runs: list) -> list[str]:
    """The labels of the runs (``Run``s), colliding ones told apart by their folder's name (then a number)."""
    labels = [r.label for r in runs]
    out = []
    for r, label in zip(runs, labels):
        out.append(f"{label} [{r.folder.name}]" if labels.count(label) > 1 else label)
    seen: dict[str, int] = {}
    for i, label in enumerate(out):
        if out.count(label) > 1:
            seen[label] = seen.get(label, 0) + 1
            out[i] = f"{label} #{seen[label]}"
    return out
