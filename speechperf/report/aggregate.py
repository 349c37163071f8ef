"""Tables that combine runs: price/performance per platform and repeated runs (MLPerf rule)."""
from __future__ import annotations

import json
import statistics

from speechperf.config import ConfigError, load_platform
from speechperf.metrics.tta import tta_minutes

# The paper's TTA to dev-clean CER 10 on LibriSpeech (SPEC D), for orientation beside ours.
PAPER_TTA_CER10 = {"sys1": 820.0, "sys2": 672.0, "sys10": 511.0}


def run_tta(run: dict, target: float = 10.0, metric: str = "cer") -> float | None:
    return tta_minutes([(e["clock_s"], e[metric]) for e in run["evals"]], target, 3)


def energy_until(run: dict, seconds: float | None) -> float | None:
    """Joules from the energy counters up to ``seconds`` of the run (None: not measured)."""
    if seconds is None:
        return None
    total, found = 0.0, False
    for source in {s["source"] for s in run["samples"] if s["metric"] == "energy_j"}:
        pts = sorted((s["t"], s["value"]) for s in run["samples"] if s["source"] == source and s["metric"] == "energy_j")
        upto = [v for t, v in pts if t <= seconds] or [pts[0][1]]
        total += upto[-1] - (pts[0][1] if source.startswith("gpu") else 0.0)
        found = True
    return total if found else None


def price_rows(runs: list[dict], target: float = 10.0) -> list[dict]:
    """TTA x price, TTA x $/hour and energy to accuracy, per run with a platform profile,
    then the paper's platforms with the paper's TTA (LibriSpeech, not comparable in size)."""
    rows = []
    for r in runs:
        name = r["env"].get("platform")
        facts = {}
        if name:
            try:
                facts = load_platform(name).get("platform", {})
            except ConfigError:
                facts = {}
        tta = run_tta(r, target)
        joules = energy_until(r, tta * 60 if tta is not None else None)
        rows.append(_price_row(r["label"], name or "this machine (no price given)", tta, facts, joules))
    for name, tta in PAPER_TTA_CER10.items():
        rows.append(_price_row("paper, LibriSpeech", load_platform(name)["platform"]["name"], tta,
                               load_platform(name)["platform"], None))
    return rows


def _price_row(label, platform, tta, facts, joules) -> dict:
    price, hourly = facts.get("price_usd"), facts.get("usd_per_hour")
    return {"run": label, "platform": platform, "TTA CER 10 min": tta, "price $": price,
            "price date": facts.get("price_date"),
            "TTA x price ($ min)": tta * price if tta is not None and price else None,
            "cost at $/hour": tta / 60 * hourly if tta is not None and hourly else None,
            "energy to accuracy kWh": joules / 3.6e6 if joules is not None else None}


def repeated_rows(runs: list[dict], target: float = 10.0) -> list[dict]:
    """Runs that differ only in seed, grouped; TTA as MLPerf aggregates it (drop the fastest
    and the slowest, average the rest) beside median, spread and runs that never reached it."""
    groups: dict[str, list[dict]] = {}
    for r in runs:
        cfg = json.loads(json.dumps(r["config"]))
        cfg.get("train", {}).pop("seed", None)
        groups.setdefault(json.dumps(cfg, sort_keys=True), []).append(r)
    rows = []
    for members in groups.values():
        if len(members) < 2:
            continue
        ttas = [run_tta(r, target) for r in members]
        done = sorted(t for t in ttas if t is not None)
        kept = done[1:-1] if len(done) >= 3 else done
        rows.append({"preset": members[0]["config"].get("preset"), "runs": len(members),
                     "seeds": ", ".join(str(r["row"].get("seed")) for r in members),
                     "MLPerf mean TTA min": statistics.mean(kept) if kept else None,
                     "median TTA min": statistics.median(done) if done else None,
                     "min": done[0] if done else None, "max": done[-1] if done else None,
                     "never reached": ttas.count(None)})
    return rows
