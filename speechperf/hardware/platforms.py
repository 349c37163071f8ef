"""Platforms: the machines runs are made on, their prices, and price/performance.

Profiles are TOML files in ``speechperf/config/platforms/``: the ASR paper's 2019 machines
(Sys1$, Sys2$, Sys10$; Table 1 prices, Table 2 loader values) and the GPUs and cloud
instances people rent and buy today. Every price in a profile carries the date it was
quoted and who quoted it (``hourly_date``/``hourly_source`` for the on-demand rate,
``price_date``/``price_source`` for a purchase price), because prices move and a price
without its date and source misleads. A GPU profile names the device strings NVML/torch
report for it (``gpu_names``) and says whether its prices are per GPU (``per_gpu``,
scaled by the run's GPU count) or for a whole machine of ``gpus`` GPUs; a cloud instance
profile names the instance types it is (``instance_types``, matched against the
instance type the run recorded, never guessed from a CPU model).

The platform of a run, in order of precedence: ``--price-per-hour`` (the hourly rate
only), ``--platform-file FILE.toml`` (both given when reading the run: ``tta``,
``report``), the platform named at training time (``train --platform NAME|FILE``), the
profile its recorded environment matches (GPU model and count, or cloud instance type).
Hardware no profile matches gets no price and a note saying so, never a guessed price.
"""
from __future__ import annotations

import dataclasses
import datetime
import re
from dataclasses import dataclass
from pathlib import Path

from speechperf.config import ConfigError, load_platform, platform_names
from speechperf.hardware.machine import devices, gpu_count, hardware, instance_type

PURCHASE_KEYS = ("price_usd", "price_gpus_usd", "price_cpus_usd")  # what buying it costs
HOURLY_KEYS = ("usd_per_hour",)  # what renting it costs
PRICE_KEYS = PURCHASE_KEYS + HOURLY_KEYS
PEAK_DTYPES = ("fp32", "tf32", "bf16", "fp16")  # peak_tflops_<dtype>: dense vendor peak per GPU
PAPER_SYSTEMS = ("sys1", "sys2", "sys10")  # the ASR paper's Table 1 machines
DATE = re.compile(r"^\d{4}(-\d{2}(-\d{2})?)?$")  # when a price was quoted: YYYY, YYYY-MM or YYYY-MM-DD
READ_TIME = "price_overrides"  # env key set by with_price_overrides (never written to disk)
WHAT = {"purchase": "a purchase price", "hourly": "an hourly rate"}  # for messages


@dataclass(frozen=True)
class Platform:
    """One machine and what it costs (prices for the whole machine once resolved for a run)."""

    key: str  # profile name ("sys1", "h100-sxm"), a TOML path, or "detected"
    name: str  # display name, e.g. "Sys1$", "2x NVIDIA L4"
    devices: str  # GPUs, CPUs and memory in words
    gpus: int = 0  # GPUs of the priced machine (a per-GPU profile: 1 until resolved for a run)
    price_usd: float | None = None  # purchase price of the whole machine
    price_gpus_usd: float | None = None  # of which the GPUs (a GPU profile: the GPUs alone)
    price_cpus_usd: float | None = None  # of which the CPUs
    usd_per_hour: float | None = None  # on-demand rental rate
    price_date: str | None = None  # when the purchase price was quoted
    price_source: str | None = None  # who quoted the purchase price
    hourly_date: str | None = None  # when the hourly rate was quoted
    hourly_source: str | None = None  # who quoted the hourly rate
    per_gpu: bool = False  # prices are per GPU and scale with the run's GPU count
    gpu_names: tuple[str, ...] = ()  # NVML/torch device names this profile prices
    instance_types: tuple[str, ...] = ()  # cloud instance types (DMI product name) this profile prices
    cpu_names: tuple[str, ...] = ()  # CPU models (env.json cpu_model) only this instance has: matched per vCPU
    vcpus: int = 0  # the instance's vCPUs: a run matched by its CPU model pays its logical CPUs' share of the rate
    note: str | None = None  # what the prices cover, or why there is none
    peak_tflops_fp32: float | None = None  # dense vendor peak of one GPU, fp32 (no tensor cores)
    peak_tflops_tf32: float | None = None  # dense, tf32 on tensor cores (sparsity figures halved)
    peak_tflops_bf16: float | None = None  # dense, bf16 on tensor cores, fp32 accumulate
    peak_tflops_fp16: float | None = None  # dense, fp16 on tensor cores, fp32 accumulate
    peak_date: str | None = None  # date of the datasheet the peaks come from
    peak_source: str | None = None  # the datasheet the peaks come from
    source: str = "preset"  # "preset", "file", "detected", "--price-per-hour"

    @property
    def priced(self) -> bool:
        return self.price_usd is not None or self.price_gpus_usd is not None or self.usd_per_hour is not None


def _fail(where: str, message: str):
    raise ConfigError(f"{where}: [platform] {message}")


def load(name: str) -> Platform:
    """A profile by name ("sys1", "h100-sxm") or a user TOML file (a path ending in .toml), validated.

    A profile's prices need a date and a source; a user file's prices need a date, and
    their source defaults to the file. Prices are as quoted (per GPU where ``per_gpu``);
    :func:`resolve` turns them into the price of a run's machine.
    """
    is_file = name.endswith(".toml")
    where = name if is_file else f"platform profile {name!r}"
    facts = load_platform(name).get("platform")
    if not isinstance(facts, dict):
        raise ConfigError(f"{where}: no [platform] section")
    lists = _check_fields(where, facts)
    dates, sources = _dated_sources(where, facts, is_file, name)
    prices = {k: float(facts[k]) for k in PRICE_KEYS if facts.get(k) is not None}
    hourly = "usd_per_hour" in prices
    peaks = _peaks(where, facts, is_file, name)
    return Platform(key=name, name=facts["name"], devices=facts["devices"], gpus=facts.get("gpus", 0),
                    per_gpu=facts.get("per_gpu", False), vcpus=facts.get("vcpus", 0),
                    price_date=facts.get("price_date"), price_source=sources["purchase"],
                    hourly_date=dates["hourly"] if hourly else None,
                    hourly_source=sources["hourly"] if hourly else None,
                    note=facts.get("note"), source="file" if is_file else "preset", **lists, **prices, **peaks)


def _check_fields(where: str, facts: dict) -> dict[str, tuple[str, ...]]:
    """Every field's type and range (refused naming the profile and the field); returns the
    profile's lists (gpu_names, instance_types) as tuples."""
    fields = {f.name for f in dataclasses.fields(Platform)} - {"key", "source"}
    unknown = set(facts) - fields
    if unknown:
        _fail(where, f"unknown keys {sorted(unknown)}; known: {sorted(fields)}")
    for key in ("name", "devices"):
        if not isinstance(facts.get(key), str) or not facts[key].strip():
            _fail(where, f"{key} must be a non-empty string")
    for key in PRICE_KEYS + tuple(f"peak_tflops_{d}" for d in PEAK_DTYPES):
        value = facts.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            _fail(where, f"{key} = {value!r} must be a non-negative number")
    gpus = facts.get("gpus", 0)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        _fail(where, f"gpus = {gpus!r} must be a non-negative integer")
    per_gpu = facts.get("per_gpu", False)
    if not isinstance(per_gpu, bool):
        _fail(where, f"per_gpu = {per_gpu!r} must be true or false")
    if per_gpu and gpus != 1:
        _fail(where, f"per_gpu = true prices one GPU, so gpus must be 1 (got {gpus})")
    lists = {}
    vcpus = facts.get("vcpus", 0)
    if isinstance(vcpus, bool) or not isinstance(vcpus, int) or vcpus < 0:
        _fail(where, f"vcpus = {vcpus!r} must be a non-negative integer")
    for key in ("gpu_names", "instance_types", "cpu_names"):
        value = facts.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            _fail(where, f"{key} must be a list of non-empty strings")
        lists[key] = tuple(value)
    if per_gpu and not lists["gpu_names"]:
        _fail(where, "per_gpu = true needs gpu_names (which GPUs it prices)")
    if lists["cpu_names"] and not vcpus:
        _fail(where, "cpu_names needs vcpus (a run matched by its CPU pays its logical CPUs' share of the rate)")
    for key in ("price_date", "price_source", "hourly_date", "hourly_source", "note", "peak_date", "peak_source"):
        if facts.get(key) is not None and (not isinstance(facts[key], str) or not facts[key].strip()):
            _fail(where, f"{key} must be a non-empty string")
    return lists


def _dated_sources(where: str, facts: dict, is_file: bool, name: str) -> tuple[dict, dict]:
    """The purchase and hourly prices' dates and sources: a price needs both (a user file's
    source defaults to the file)."""
    dates = {"purchase": facts.get("price_date"),
             # a user file of the older form dates its hourly rate with price_date
             "hourly": facts.get("hourly_date") or (facts.get("price_date") if is_file else None)}
    sources = {"purchase": facts.get("price_source"), "hourly": facts.get("hourly_source")}
    for kind, keys, date_key, source_key in (("purchase", PURCHASE_KEYS, "price_date", "price_source"),
                                             ("hourly", HOURLY_KEYS, "hourly_date", "hourly_source")):
        if not any(facts.get(k) is not None for k in keys):
            continue
        if not dates[kind]:
            _fail(where, f"has {WHAT[kind]} but no {date_key} (when was it quoted?)")
        if not DATE.match(dates[kind]):
            _fail(where, f"{date_key} = {dates[kind]!r} is not YYYY, YYYY-MM or YYYY-MM-DD")
        if not sources[kind]:
            if not is_file:
                _fail(where, f"has {WHAT[kind]} but no {source_key} (who quoted it?)")
            sources[kind] = f"user file {name}"
    return dates, sources


def _peaks(where: str, facts: dict, is_file: bool, name: str) -> dict:
    """The profile's peak TFLOPS fields, validated: a peak needs the date of its datasheet
    and (in a shipped profile) its source."""
    peaks = {f"peak_tflops_{d}": float(facts[f"peak_tflops_{d}"]) for d in PEAK_DTYPES
             if facts.get(f"peak_tflops_{d}") is not None}
    if not peaks:
        return {}
    if not facts.get("peak_date") or not DATE.match(facts["peak_date"]):
        _fail(where, f"has peak TFLOPS but peak_date = {facts.get('peak_date')!r} is not YYYY, YYYY-MM or YYYY-MM-DD")
    if not facts.get("peak_source") and not is_file:
        _fail(where, "has peak TFLOPS but no peak_source (which datasheet?)")
    return {**peaks, "peak_date": facts["peak_date"], "peak_source": facts.get("peak_source") or f"user file {name}"}


def gpu_peak_tflops(device_name: str, dtype: str) -> tuple[float | None, str] | None:
    """(dense peak TFLOPS of one GPU in ``dtype``, where it comes from) from the profile whose
    ``gpu_names`` include ``device_name``; None when no profile names the GPU. A profile
    without a figure for ``dtype`` gives (None, why)."""
    for p in profiles():
        if _norm(device_name) in {_norm(n) for n in p.gpu_names}:
            value = getattr(p, f"peak_tflops_{dtype}", None)
            if value is None:
                return None, f"platform profile {p.key!r} has no dense {dtype} peak"
            return value, f"{p.peak_source.split(',')[0]} ({p.peak_date}), dense {dtype}; platform profile {p.key}"
    return None


def profiles() -> list[Platform]:
    """Every profile shipped in ``speechperf/config/platforms/``."""
    return [load(n) for n in platform_names()]


def presets() -> list[Platform]:
    """The paper's platforms, cheapest first."""
    return sorted((load(n) for n in PAPER_SYSTEMS), key=lambda p: p.price_usd or 0.0)


def describe(env: dict) -> Platform:
    """The machine of a recorded environment (``capture_env``), named from its CPU and GPUs; no price."""
    name, words = devices(env)
    return Platform(key="detected", name=name, devices=words, gpus=len(env.get("gpus") or []), source="detected")


def _norm(s: str) -> str:
    return " ".join(s.casefold().split())


def match(env: dict, candidates: list[Platform] | None = None) -> list[Platform]:
    """The profiles that price a recorded environment: for GPUs, profiles of exactly ``n`` GPUs of
    its model, else its per-GPU profiles; without GPUs, the profiles of its EC2 instance type."""
    candidates = profiles() if candidates is None else candidates
    gpus = env.get("gpus") or []
    if gpus:
        models = {_norm(g.get("name", "")) for g in gpus}
        if len(models) != 1:
            return []  # mixed GPU models: no single profile prices them
        model = models.pop()
        mine = [p for p in candidates if model in {_norm(n) for n in p.gpu_names}]
        exact = [p for p in mine if not p.per_gpu and p.gpus == gpu_count(env)[0]]
        return exact or [p for p in mine if p.per_gpu]
    instance = instance_type(env)
    if instance is not None:
        return [p for p in candidates if not p.gpu_names and instance in p.instance_types]
    cpu = _norm(env.get("cpu_model") or "")  # no instance recorded: a CPU model only one instance type has
    return [p for p in candidates if not p.gpu_names and cpu and cpu in {_norm(n) for n in p.cpu_names}]


def per_vcpu(profile: Platform, env: dict) -> Platform:
    """``profile`` (an instance matched by the run's CPU model, not its instance type) priced for the
    run's logical CPUs: its hourly rate x cores / the instance's vCPUs, as a per-GPU profile scales
    by GPUs (the rest of the host not priced)."""
    cores = env.get("cpu_cores_logical")
    if not profile.vcpus or not cores or profile.usd_per_hour is None:
        return profile
    note = "; ".join(x for x in (f"{cores}/{profile.vcpus} of the {profile.name} rate: matched by its CPU model "
                                 f"({env.get('cpu_model')}), priced per vCPU", profile.note) if x)
    return dataclasses.replace(profile, name=f"{cores} vCPU of {profile.name}",
                               usd_per_hour=profile.usd_per_hour * cores / profile.vcpus, note=note)


def resolve(profile: Platform, env: dict) -> Platform:
    """``profile``'s prices for the machine of ``env``: a per-GPU profile times the run's GPUs."""
    if not profile.per_gpu:
        return profile
    n, why = gpu_count(env)
    n = n or profile.gpus  # a GPU profile named for a run that recorded no GPU: as named
    scale = lambda v: None if v is None else v * n  # noqa: E731
    note = "; ".join(x for x in (f"{n} x the per-GPU prices (host not priced)", why, profile.note) if x)
    return dataclasses.replace(profile, name=f"{n}x {profile.name}" if n != 1 else profile.name, gpus=n,
                               usd_per_hour=scale(profile.usd_per_hour), price_gpus_usd=scale(profile.price_gpus_usd),
                               price_usd=scale(profile.price_usd), price_cpus_usd=scale(profile.price_cpus_usd),
                               note=note)


def detect_from_env(env: dict) -> Platform:
    """The profile the recorded environment matches, resolved for it; else the described machine
    with a note saying there is no price for it."""
    found = match(env)
    if len(found) > 1:  # the profile test forbids this; a user-added file could still do it
        raise ConfigError(f"platform profiles {', '.join(p.key for p in found)} all match {hardware(env)}; "
                          "remove one or name the platform (train --platform, --platform-file)")
    base = describe(env)
    if not found:
        return dataclasses.replace(base, note=f"no price for {hardware(env)}; give --price-per-hour")
    p = resolve(found[0], env) if found[0].gpu_names or instance_type(env) else per_vcpu(found[0], env)
    return dataclasses.replace(p, devices=base.devices, source=f"detected ({p.key})")


def with_price_overrides(env: dict, price_per_hour: float | None = None,
                         platform_file: str | Path | None = None) -> dict:
    """``env`` with read-time overrides (``--price-per-hour``, ``--platform-file``) that
    :func:`of_run` applies before anything the run recorded; the run's files are not touched."""
    if price_per_hour is None and platform_file is None:
        return env
    if price_per_hour is not None and (isinstance(price_per_hour, bool) or price_per_hour < 0):
        raise ConfigError(f"--price-per-hour {price_per_hour!r} must be a non-negative number")
    if platform_file is not None:
        load(str(platform_file))  # a bad file fails here, naming it, not once per table
    return {**env, READ_TIME: {"price_per_hour": price_per_hour,
                               "platform_file": str(platform_file) if platform_file is not None else None}}


def of_run(env: dict) -> Platform:
    """The platform of a run: ``--price-per-hour`` > ``--platform-file`` > the platform the run
    named (``train --platform``) > the profile its environment matches > no price, with a note.

    A named platform that no longer loads (a moved user file) falls back to the environment,
    with the reason in ``note``.
    """
    overrides = env.get(READ_TIME) or {}
    named = overrides.get("platform_file") or env.get("platform")
    plat = None
    if named:
        try:
            plat = dataclasses.replace(resolve(load(named), env), source="--platform-file" if overrides.get(
                "platform_file") else f"named ({named})")
        except ConfigError as e:
            if overrides.get("platform_file"):
                raise
            found = detect_from_env(env)
            plat = dataclasses.replace(found, note="; ".join(x for x in (f"platform {named!r} given at training "
                                                                         f"does not load ({e})", found.note) if x))
    if plat is None:
        plat = detect_from_env(env)
    rate = overrides.get("price_per_hour")
    if rate is not None:
        plat = dataclasses.replace(plat, usd_per_hour=float(rate), hourly_source="--price-per-hour",
                                   hourly_date=datetime.date.today().isoformat(),
                                   note=f"$/hour given with --price-per-hour for the whole machine ({hardware(env)})")
    return plat


def table(platforms: list[Platform]) -> list[dict]:
    """Table 1: devices and prices with their date and source."""
    return [{"platform": p.name, "devices": p.devices, "GPUs": p.gpus, "price $": p.price_usd,
             "GPUs $": p.price_gpus_usd, "CPUs $": p.price_cpus_usd, "price date": p.price_date,
             "price source": p.price_source, "$/hour": p.usd_per_hour, "hourly date": p.hourly_date,
             "hourly source": p.hourly_source, "note": p.note, "source": p.source} for p in platforms]


def price_performance(tta_min: float | None, platform: Platform, energy_j: float | None = None) -> dict:
    """TTA x purchase price ($ min: lower is better), the rental cost of reaching the target
    (TTA in hours x $/hour) and the energy to accuracy in kWh, with a note saying why any of
    them is missing. None means the run never reached the target or the factor is missing;
    the note tells which."""
    reached = tta_min is not None
    purchase = platform.price_usd if platform.price_usd is not None else platform.price_gpus_usd
    notes = []
    if not reached:
        notes.append("target not reached")
    else:
        unpriced = platform.usd_per_hour is None and purchase is None
        if (platform.usd_per_hour is None or purchase is None) and not (unpriced and platform.note):
            asked = (("hourly rate", platform.usd_per_hour), ("purchase price", purchase))
            missing = [w for w, v in asked if v is None]
            notes.append(f"no {' or '.join(missing)} for {platform.name}" + ("; give --price-per-hour"
                                                                             if platform.usd_per_hour is None else ""))
        if purchase is not None and platform.price_usd is None:
            notes.append("TTA x price uses the GPUs' price (host not priced)")
        if energy_j is None:
            notes.append("no energy counter or power samples")
    if platform.note:
        notes.append(platform.note)
    return {
        "TTA min": tta_min,
        "TTA x price ($ min)": tta_min * purchase if reached and purchase is not None else None,
        "cost to accuracy $": tta_min / 60.0 * platform.usd_per_hour
        if reached and platform.usd_per_hour is not None else None,
        "energy to accuracy kWh": energy_j / 3.6e6 if reached and energy_j is not None else None,
        "price note": "; ".join(dict.fromkeys(notes)) or None,
    }


def price_columns(env: dict, tta_min: float | None, energy_j: float | None = None) -> dict:
    """The platform and price/performance columns of one run's row (``tta``, ``report``)."""
    plat = of_run(env)
    return {"platform": plat.name, "price $": plat.price_usd if plat.price_usd is not None else plat.price_gpus_usd,
            "price date": plat.price_date, "$/hour": plat.usd_per_hour, "hourly date": plat.hourly_date,
            **price_performance(tta_min, plat, energy_j)}


def profile_table(files: list[str | Path] = ()) -> list[dict]:
    """Rows for ``speechperf platforms``: every profile (and user file) as quoted, with what it
    matches, each price with its date and source."""
    rows = []
    for p in profiles() + [load(str(f)) for f in files]:
        per = ("GPU" if p.per_gpu else "instance" if p.instance_types
               else f"{p.gpus}-GPU machine" if p.gpus else "machine")
        rows.append({"profile": p.key, "name": p.name,
                     "matches": ", ".join(p.gpu_names + p.instance_types + p.cpu_names) or None,
                     "GPUs": p.gpus, "per": per, "$/hour": p.usd_per_hour, "hourly date": p.hourly_date,
                     "hourly source": p.hourly_source,
                     "purchase $": p.price_usd if p.price_usd is not None else p.price_gpus_usd,
                     "price date": p.price_date, "price source": p.price_source, "note": p.note})
    return rows
