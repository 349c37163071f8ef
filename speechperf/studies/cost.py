"""``speechperf cost``: what training a workload on a corpus costs, from a measured throughput:
device-hours, wall hours, kWh and dollars at 1 and N devices, each with the spread of the measured
steps (the fastest step's rate gives the low end, the slowest's the high end, the median the figure).

The throughput comes from one of three places, each read as data only (JSON and SQLite, never code):
a saved ``bench scale --json`` output (its row of the workload, world 1: the timed steps' audio
seconds per second, min/median/max), a finished (or stopped) run folder of one device (its
iterations' audio seconds per second; its power samples; its platform as ``tta`` prices it), or
measured now by ``bench scale`` at its smallest batch (bench/scale.py).

The arithmetic, for A audio seconds to train (corpus hours x 3600 x epochs, or steps x the measured
batches' mean audio seconds), a rate r (audio s/s of one device), N devices at scaling efficiency e:
wall hours = A / (r N e) / 3600, device-hours = N x wall hours, kWh = P x device-hours / 1000 with P the
measured watts of one device, dollars = price per device-hour x device-hours. Energy is computed only
from a power reading (never an assumed wattage); dollars only from a dated price (the platform
profiles ``speechperf platforms`` lists, or ``--price-per-hour``). N devices use a measured scaling
efficiency where the saved measurement holds one for N (a bench scale row at world N with its
``scaling_efficiency``), else the user's ``--efficiency`` (default 1.0), said to be an assumption.
Evaluation, checkpoints, start-up and a loader slower than the step are not counted: the figures
are the training steps' alone, said so.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from speechperf.bench.scale_launch import is_number, read_rows
from speechperf.config import load_preset, preset_names
from speechperf.errors import ConfigError, SpeechperfError
from speechperf.results import layout
from speechperf.results.view import RunView
from speechperf.telemetry import energy
from speechperf.hardware import platforms
from speechperf.hardware.environment import capture_env

COLUMNS = ("devices", "efficiency", "wall_h", "device_h", "device_h_low", "device_h_high", "kwh", "kwh_low",
           "kwh_high", "usd", "usd_low", "usd_high")
UNCOUNTED = ("not counted: evaluation, checkpoints, start-up, and a loader slower than the step (the figures are "
             "the training steps' alone)")


class CostError(SpeechperfError):
    """A cost that cannot be computed from what was given: the value or file named (exit 2)."""


@dataclass(frozen=True)
class CostRequest:
    """What ``speechperf cost`` asks."""

    workload: str  # a preset (fastconformer-l, ...): the model and batches measured
    hours: float  # the corpus's hours of audio
    epochs: float | None = None  # passes over the corpus (one of epochs and steps)
    steps: int | None = None  # training steps of the measured batches instead
    devices: int = 8  # N: the second device count priced (1 is always priced)
    efficiency: float | None = None  # N devices' scaling efficiency when none is measured (None: 1.0, an assumption)
    source: Path | None = None  # a bench scale --json file or a run folder; None: measured now
    platform: str | None = None  # a platform profile name or TOML file pricing the device
    price_per_hour: float | None = None  # dollars per device-hour, given (wins over any profile)
    device: str = "cpu"  # measured now: the device
    precision: str | None = None  # measured now: the precision (None: bench scale's default)
    overrides: tuple[str, ...] = ()  # measured now: key=value overrides of the workload's preset

    def problems(self) -> list[str]:
        out = []
        if self.workload not in preset_names():
            out.append(f"workload {self.workload!r} is not a preset (known: {', '.join(preset_names())})")
        if not (isinstance(self.hours, (int, float)) and math.isfinite(self.hours) and self.hours > 0):
            out.append(f"--hours {self.hours} must be a positive number of hours")
        if (self.epochs is None) == (self.steps is None):
            out.append("give one of --epochs and --steps")
        if self.epochs is not None and not (math.isfinite(self.epochs) and self.epochs > 0):
            out.append(f"--epochs {self.epochs} must be positive")
        if self.steps is not None and self.steps < 1:
            out.append(f"--steps {self.steps} must be at least 1")
        if self.devices < 1:
            out.append(f"--devices {self.devices} must be at least 1")
        if self.efficiency is not None and not (0 < self.efficiency <= 1):
            out.append(f"--efficiency {self.efficiency} must be in (0, 1]")
        if self.price_per_hour is not None and not (math.isfinite(self.price_per_hour) and self.price_per_hour >= 0):
            out.append(f"--price-per-hour {self.price_per_hour} must be a non-negative number")
        if self.overrides and self.source is not None:
            out.append(f"overrides {' '.join(self.overrides)} apply to a measurement made now, not to {self.source}")
        return out


@dataclass(frozen=True)
class Throughput:
    """A workload's measured training rate on one device, and what came with it."""

    rates: tuple[float, float, float]  # audio seconds per second of one device: min, median, max over the steps
    steps: int  # the measured steps
    audio_per_step: float  # mean audio seconds of a measured step
    source: str  # where it was measured, in words
    power_w: float | None = None  # watts of the device while it trained (None: no reading)
    power_note: str = "no power reading: energy not computed"  # the power source, or why none
    env: dict | None = None  # the machine's recorded environment (prices it); None: unknown
    efficiency: dict[int, float] = field(default_factory=dict)  # measured scaling efficiency by device count
    spread_note: str = ""  # where the spread is not the steps' own
    device: str = ""  # the measured device ("cpu", "cuda:0"; "" unknown)


def estimate(audio_s: float, rate: float, devices: int, efficiency: float, power_w: float | None,
             usd_per_device_h: float | None) -> dict:
    """Training ``audio_s`` audio seconds at ``rate`` audio s/s per device on ``devices`` devices at
    ``efficiency``: {"wall_h", "device_h", "kwh" (None without power), "usd" (None without a price)}."""
    wall_h = audio_s / (rate * devices * efficiency) / 3600
    device_h = wall_h * devices
    return {"wall_h": wall_h, "device_h": device_h, "kwh": None if power_w is None else power_w * device_h / 1000,
            "usd": None if usd_per_device_h is None else usd_per_device_h * device_h}


def rows(audio_s: float, t: Throughput, devices: int, efficiency: float, usd_per_device_h: float | None,
         counts: list[int] | None = None) -> list[dict]:
    """One row per device count (``counts``; default 1 and ``devices``; every count but 1 at
    ``efficiency``): the median step's figures, and the low and high ends from the fastest and the
    slowest step's rate."""
    out = []
    for n in sorted(set(counts or (1, devices))):
        e = 1.0 if n == 1 else efficiency
        low, mid, high = (estimate(audio_s, r, n, e, t.power_w, usd_per_device_h) for r in (t.rates[2], t.rates[1],
                                                                                           t.rates[0]))
        row = {"devices": n, "efficiency": e, "wall_h": mid["wall_h"]}
        for k in ("device_h", "kwh", "usd"):
            row.update({k: mid[k], f"{k}_low": low[k], f"{k}_high": high[k]})
        out.append(row)
    return out


# ---- where the throughput comes from ------------------------------------------------------------
def _scale_rows(path: Path) -> list[dict]:
    """A ``bench scale --json`` file's rows, checked (bench/scale_launch.py's ``read_rows``)."""
    try:
        return read_rows(path)
    except SpeechperfError as e:
        raise CostError(str(e)) from e


def from_scale_file(path: Path, workload: str) -> Throughput:
    """The workload's measured row (world 1, status ok) of a saved ``bench scale --json`` output; the
    fastest where it holds several batch durations; a row at world N with a ``scaling_efficiency``
    gives N's."""
    data = _scale_rows(path)
    ok = [r for r in data if r["workload"] == workload and r["status"] == "ok" and r.get("audio_s_per_s")]
    ones = [r for r in ok if r.get("world", 1) == 1]
    if not ones:
        held = sorted({f"{r['workload']} ({r['status'][:40]})" for r in data})
        raise CostError(f"{path}: no measured one-device row of workload {workload!r} (it holds: {', '.join(held)})")
    best = max(ones, key=lambda r: r.get("audio_s_per_s_median") or r["audio_s_per_s"])
    return _throughput(best, f"bench scale file {path}", None, _efficiencies(ok, best))


def _efficiencies(rows_: list[dict], one: dict) -> dict[int, float]:
    return {int(r["world"]): float(r["scaling_efficiency"]) for r in rows_
            if is_number(r.get("world")) and r["world"] > 1 and r.get("scaling_efficiency") is not None
            and r.get("batch_s") == one.get("batch_s")}


def _throughput(row: dict, where: str, env: dict | None, efficiency: dict[int, float]) -> Throughput:
    """A bench scale row as a Throughput: its steps' rates (or its one mean rate, said so) and power."""
    spread = [row.get(f"audio_s_per_s_{k}") for k in ("min", "median", "max")]
    note = ""
    if None in spread:
        spread, note = [row["audio_s_per_s"]] * 3, "the row holds one mean rate (no per-step spread): spread 0"
    steps = int(row.get("steps") or 1)
    audio = row["audio_s_per_s"] * row["step_s"] if row.get("step_s") else row.get("padded_s") or 0.0
    what = (f"{where}: {row['workload']}, device {row.get('device')}, {row.get('precision')}, "
            f"{row.get('batch_s') or 0:g} s batches, {steps} steps")
    power = row.get("power_w")
    pnote = (f"{power:.1f} W measured ({row.get('energy') or 'bench scale power meter'})" if power is not None else
             f"no power reading ({row.get('energy') or 'none recorded'}): energy not computed")
    return Throughput(tuple(sorted(spread)), steps, audio, what, power, pnote, env, efficiency, note,
                      str(row.get("device") or ""))


def from_run(folder: Path, workload: str) -> Throughput:
    """A run folder's training rate (its iterations' audio s/s), power (its samples) and machine."""
    with RunView.open(folder) as r:
        preset = r.config.get("preset")
        if preset != workload:
            raise CostError(f"run {folder} trained preset {preset!r}, not workload {workload!r}")
        world = int(r.env.get("world_size") or 1)
        if world != 1:
            raise CostError(f"run {folder} trained on {world} devices: cost reads a one-device run (or bench scale's "
                            "rows, whose efficiency at N devices is measured)")
        its = [x for x in r.rows.iterations() if is_number(x.get("audio_s_per_s")) and x["audio_s_per_s"] > 0]
        if not its:
            raise CostError(f"run {folder} holds no iteration with a measured rate (audio_s_per_s)")
        rates = [x["audio_s_per_s"] for x in its]
        samples, env = r.rows.samples(), r.env
        clock = max(x.get("clock_s") or 0.0 for x in its)
    joules = energy.total(samples, clock) if energy.measures_energy(samples) and clock > 0 else None
    power = joules / clock if joules else None
    pnote = (f"{power:.1f} W: the run's energy over its {clock:.0f} s of training clock" if power else
             f"no power reading ({energy.why_missing(env)}): energy not computed")
    audio = statistics.mean(x["audio_s"] for x in its if is_number(x.get("audio_s")))
    return Throughput((min(rates), statistics.median(rates), max(rates)), len(rates), audio,
                      f"run {folder}: {len(rates)} logged steps, device {env.get('device')}", power, pnote, env,
                      device=str(env.get("device") or ""))


def measure_now(workload: str, device: str, precision: str | None, overrides: tuple[str, ...] = ()) -> Throughput:
    """``bench scale`` at its smallest batch on this machine, now (its module imported here: torch's
    training step is no part of reading a saved measurement)."""
    from speechperf.bench.scale import Request, run_scale  # loads torch (see above)

    (row,) = run_scale(Request((workload,), None, steps=3, warmup=1, device=device, precision=precision,
                               measure_memory=False, overrides=overrides))
    if row["status"] != "ok":
        raise CostError(f"bench scale could not measure {workload} here: {row['status']}")
    return _throughput(row, "measured now by bench scale", capture_env(device), {})


def throughput(req: CostRequest) -> Throughput:
    """The request's measured rate: from its file or run folder (data only), else measured now."""
    src = req.source
    if src is None:
        return measure_now(req.workload, req.device, req.precision, req.overrides)
    if src.is_dir():
        if not layout.is_run(src):
            raise CostError(f"{src}: neither a run folder nor a bench scale --json file")
        return from_run(src, req.workload)
    if not src.is_file():
        raise CostError(f"{src}: no such file or run folder")
    return from_scale_file(src, req.workload)


# ---- prices, efficiency, the answer -------------------------------------------------------------
def price(req: CostRequest, env: dict | None, device: str = "") -> tuple[float | None, str]:
    """(dollars per device-hour or None, the price line): ``--price-per-hour``, else the platform
    profile named, else the one the measured machine's environment matches (as ``tta`` prices runs)."""
    if req.price_per_hour is not None:
        return req.price_per_hour, f"price: ${req.price_per_hour:g} per device-hour (--price-per-hour, given)"
    try:
        if req.platform is not None:
            plat = platforms.load(req.platform)
            plat = platforms.resolve(plat, env) if env is not None else plat
        elif env is not None:
            plat = platforms.of_run(env)
        else:
            return None, ("no price: the saved measurement names no machine; give --platform NAME|FILE.toml or "
                          "--price-per-hour: dollars not computed")
    except ConfigError as e:
        raise CostError(str(e)) from e
    if plat.usd_per_hour is None:
        return None, f"no price: {plat.note or f'no hourly rate for {plat.name}'}; dollars not computed"
    per_device = plat.usd_per_hour / max(plat.gpus, 1)
    what_if = (f" (a what-if: the throughput was measured on {device}, the price is a GPU's)"
               if plat.gpus and device.startswith("cpu") else "")
    return per_device, (f"price: ${per_device:g} per device-hour: {plat.name}, {plat.hourly_source} "
                        f"({plat.hourly_date}){what_if}")


def efficiency(req: CostRequest, t: Throughput) -> tuple[float, str]:
    """(N devices' scaling efficiency, the line saying where it comes from)."""
    n = req.devices
    if n == 1:
        return 1.0, "1 device: no scaling assumed"
    if n in t.efficiency:
        ignored = f" (--efficiency {req.efficiency:g} not used)" if req.efficiency is not None else ""
        return t.efficiency[n], f"{n} devices: measured scaling efficiency {t.efficiency[n]:.3f}{ignored}"
    e = 1.0 if req.efficiency is None else req.efficiency
    default = " (the default: an assumption, not measured)" if req.efficiency is None else " (given: an assumption)"
    return e, (f"{n} devices: ASSUMED the measured 1-device throughput x {n} x efficiency {e:g}{default}; no scaling "
               f"was measured for {n} devices")


def audio_seconds(req: CostRequest, t: Throughput) -> tuple[float, str]:
    """(audio seconds trained, the line saying how many)."""
    if req.epochs is not None:
        a = req.hours * 3600 * req.epochs
        return a, f"training: {req.hours:g} h of audio x {req.epochs:g} epochs = {a / 3600:,.1f} h of audio"
    a = req.steps * t.audio_per_step
    return a, (f"training: {req.steps:,} steps of the measured batches' mean {t.audio_per_step:.1f} audio s = "
               f"{a / 3600:,.1f} h of audio ({a / 3600 / req.hours:.2f} passes over {req.hours:g} h)")


def cost(req: CostRequest, t: Throughput | None = None) -> dict:
    """``speechperf cost``: {"rows": one per device count, "assumptions": lines, "throughput": the
    measured rates}; ``t``: the throughput (default: :func:`throughput` of the request)."""
    bad = req.problems()
    if bad:
        raise CostError("; ".join(bad))
    load_preset(req.workload)  # a preset that does not load fails here, named
    t = t or throughput(req)
    audio, trained = audio_seconds(req, t)
    usd, priced = price(req, t.env, t.device)
    e, scaled = efficiency(req, t)
    lo, mid, hi = t.rates
    lines = [f"workload: {req.workload}", trained,
             f"throughput: {t.source}; audio s/s per step min {lo:.2f}, median {mid:.2f}, max {hi:.2f} "
             "(the range columns: max -> low, min -> high)" + (f"; {t.spread_note}" if t.spread_note else ""),
             scaled, priced, f"power: {t.power_note}", UNCOUNTED]
    return {"rows": rows(audio, t, req.devices, e, usd), "assumptions": lines, "workload": req.workload,
            "curve": rows(audio, t, req.devices, e, usd, curve_counts(req.devices)),
            "throughput": {"min": lo, "median": mid, "max": hi, "steps": t.steps, "source": t.source,
                           "power_w": t.power_w, "usd_per_device_h": usd, "audio_s": audio}}


def curve_counts(devices: int) -> list[int]:
    """The device counts the report's figure draws: the powers of two up to ``devices``, and it."""
    return sorted({2 ** k for k in range(devices.bit_length()) if 2 ** k <= devices} | {devices})


def read_cost(path: Path) -> dict:
    """A saved ``speechperf cost --json`` output (the report's cost figure), checked as data: its
    workload, assumptions, and rows of positive device counts and device-hours; else CostError naming it."""
    try:
        got = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CostError(f"{path}: not a speechperf cost --json output ({type(e).__name__}: {e})") from e
    ok = (isinstance(got, dict) and isinstance(got.get("workload"), str) and isinstance(got.get("assumptions"), list)
          and all(isinstance(x, str) for x in got["assumptions"]))
    for key in ("rows", "curve"):
        ok = ok and isinstance(got.get(key), list) and bool(got[key]) and all(
            isinstance(r, dict) and is_number(r.get("devices")) and r["devices"] >= 1 and is_number(r.get("device_h"))
            and r["device_h"] > 0 and all(r.get(k) is None or is_number(r[k]) for k in COLUMNS) for r in got[key])
    if not ok:
        raise CostError(f"{path}: not a speechperf cost --json output (workload, assumptions, rows and curve of "
                        "devices and device_h)")
    return got


def narrow(rows_: list[dict]) -> list[dict]:
    """The text table's rows: each figure with its low-high range beside it."""
    def num(v):
        return None if v is None else f"{v:,.2f}" if v < 100 else f"{v:,.0f}"

    def rng(r, k):
        return None if r[k] is None else f"{num(r[f'{k}_low'])}-{num(r[f'{k}_high'])}"

    return [{"devices": r["devices"], "efficiency": r["efficiency"], "wall h": num(r["wall_h"]),
             "device-h": num(r["device_h"]), "device-h range": rng(r, "device_h"), "kWh": num(r["kwh"]),
             "kWh range": rng(r, "kwh"), "$": num(r["usd"]), "$ range": rng(r, "usd")} for r in rows_]
