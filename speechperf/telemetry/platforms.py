"""Platforms: the machines runs are made on, their prices, and price/performance.

Three presets are the ASR paper's machines (Sys1$, Sys2$, Sys10$; Table 1 prices, Table 2
loader values) in ``speechperf/config/platforms/*.toml``. A user platform is a TOML file of
the same form (``[platform]`` with devices and a purchase price or a $/hour rate, and the
date that price was quoted; ``[loader]`` optional). The machine a run was made on, when no
platform was named, is described from its recorded environment (CPU and GPU models).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from speechperf.config import ConfigError, load_platform, platform_names

PRICE_KEYS = ("price_usd", "price_gpus_usd", "price_cpus_usd", "usd_per_hour")


@dataclass(frozen=True)
class Platform:
    """One machine and what it costs."""

    key: str  # preset name ("sys1"), a TOML path, or "detected"
    name: str  # display name, e.g. "Sys1$"
    devices: str  # GPUs, CPUs and memory in words
    gpus: int = 0  # number of GPUs used for training
    price_usd: float | None = None  # purchase price of the whole machine
    price_gpus_usd: float | None = None  # of which the GPUs
    price_cpus_usd: float | None = None  # of which the CPUs
    usd_per_hour: float | None = None  # rental rate (cloud), when rented instead of bought
    price_date: str | None = None  # when the price was quoted (prices move; a price without a date misleads)
    source: str = "preset"  # "preset", "file", "detected"

    @property
    def priced(self) -> bool:
        return self.price_usd is not None or self.usd_per_hour is not None


def load(name: str) -> Platform:
    """A preset by name ("sys1") or a user TOML file (a path ending in .toml), validated."""
    facts = load_platform(name).get("platform")
    where = name if name.endswith(".toml") else f"platform preset {name!r}"
    if not isinstance(facts, dict):
        raise ConfigError(f"{where}: no [platform] section")
    fields = {f.name for f in dataclasses.fields(Platform)} - {"key", "source"}
    unknown = set(facts) - fields
    if unknown:
        raise ConfigError(f"{where}: unknown [platform] keys {sorted(unknown)}; known: {sorted(fields)}")
    for key in ("name", "devices"):
        if not isinstance(facts.get(key), str) or not facts[key].strip():
            raise ConfigError(f"{where}: [platform] {key} must be a non-empty string")
    for key in PRICE_KEYS:
        value = facts.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise ConfigError(f"{where}: [platform] {key} = {value!r} must be a non-negative number")
    if any(facts.get(k) is not None for k in PRICE_KEYS) and not facts.get("price_date"):
        raise ConfigError(f"{where}: [platform] has a price but no price_date (when was it quoted?)")
    gpus = facts.get("gpus", 0)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise ConfigError(f"{where}: [platform] gpus = {gpus!r} must be a non-negative integer")
    prices = {k: float(facts[k]) for k in PRICE_KEYS if facts.get(k) is not None}
    return Platform(key=name, name=facts["name"], devices=facts["devices"], gpus=gpus, price_date=facts.get("price_date"),
                    source="file" if name.endswith(".toml") else "preset", **prices)


def presets() -> list[Platform]:
    """The paper's platforms, cheapest first."""
    return sorted((load(n) for n in platform_names()), key=lambda p: p.price_usd or 0.0)


def describe(env: dict) -> Platform:
    """The machine of a recorded environment (``capture_env``), named from its CPU and GPUs."""
    gpus = env.get("gpus") or []
    names: dict[str, int] = {}
    for g in gpus:
        names[g.get("name", "GPU")] = names.get(g.get("name", "GPU"), 0) + 1
    gpu_text = ", ".join(f"{n}x {name}" for name, n in names.items()) or "no GPU"
    cpu = env.get("cpu_model") or "unknown CPU"
    cores = env.get("cpu_cores_logical")
    memory = env.get("memory_gb")
    devices = f"{gpu_text}, {cpu}" + (f" ({cores} logical cores)" if cores else "") + (f", {memory:g} GB" if memory else "")
    name = f"{gpu_text} / {cpu}" if gpus else cpu
    return Platform(key="detected", name=name, devices=devices, gpus=len(gpus), source="detected")


def detect() -> Platform:
    """The current machine (no price: give one in a platform file)."""
    from speechperf.telemetry.environment import capture_env

    return describe(capture_env())


def of_run(env: dict) -> Platform:
    """The platform a run named (``train --platform``), else its machine from the environment.

    A named platform that no longer loads (a moved user file) falls back to the machine,
    with the reason in ``source``.
    """
    name = env.get("platform")
    if name:
        try:
            return load(name)
        except ConfigError as e:
            return dataclasses.replace(describe(env), source=f"detected ({e})")
    return describe(env)


def table(platforms: list[Platform]) -> list[dict]:
    """Table 1: devices and prices with their date."""
    return [{"platform": p.name, "devices": p.devices, "GPUs": p.gpus, "price $": p.price_usd,
             "GPUs $": p.price_gpus_usd, "CPUs $": p.price_cpus_usd, "$/hour": p.usd_per_hour,
             "price date": p.price_date, "source": p.source} for p in platforms]


def price_performance(tta_min: float | None, platform: Platform, energy_j: float | None = None) -> dict:
    """TTA x purchase price ($ min: lower is better), the rental cost of reaching the target
    (TTA in hours x $/hour) and the energy to accuracy in kWh; None where a factor is missing."""
    reached = tta_min is not None
    return {
        "TTA min": tta_min,
        "TTA x price ($ min)": tta_min * platform.price_usd if reached and platform.price_usd is not None else None,
        "cost to accuracy $": tta_min / 60.0 * platform.usd_per_hour
        if reached and platform.usd_per_hour is not None else None,
        "energy to accuracy kWh": energy_j / 3.6e6 if reached and energy_j is not None else None,
    }


def platform_table(files: list[str | Path] = ()) -> list[dict]:
    """Rows for ``speechperf platforms``: the presets, user files, and this machine."""
    return table(presets() + [load(str(f)) for f in files] + [detect()])
