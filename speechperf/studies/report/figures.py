"""The papers' figures, drawn from the results database with matplotlib (Agg, PNG).

Each function takes the runs' rows and a path, draws one figure with every run on shared
axes, and returns the path, or None with the reason when the runs hold no such data (the
report then says so instead of showing empty axes).
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy.ndimage import gaussian_filter1d  # noqa: E402

from speechperf.bench.plots import save_png  # noqa: E402
from speechperf.metric import held, per_epoch  # noqa: E402
from speechperf.scoring.targets import Targets  # noqa: E402
from speechperf.studies.report.runs import legend  # noqa: E402
from speechperf.telemetry.sample import achieved_periods  # noqa: E402


def loss_and_accuracy(runs: list[dict], path: Path, targets: Targets = Targets()) -> tuple[Path | None, str]:
    """Fig. 7: training loss (Gaussian-smoothed, sigma 10) and, a panel each, the per-epoch metrics
    the runs hold (speechperf/metric.py: validation CER, WER, ...) over time, log y; dotted: the
    ``targets`` of the runs' models. A run without a metric (None in its rows) has no line there."""
    if not any(r["iterations"] for r in runs):
        return None, "no training iterations recorded"
    shown = held([e for r in runs for e in r["evals"]], per_epoch()) or per_epoch()[:1]
    fig, axes = plt.subplots(1, 1 + len(shown), figsize=(5 * (1 + len(shown)), 4.2))
    for r in runs:
        its = r["iterations"]
        if its:
            t = np.array([i["clock_s"] for i in its]) / 60
            loss = np.array([i["loss"] for i in its], dtype=float)
            axes[0].plot(t, gaussian_filter1d(loss, sigma=10) if len(loss) > 1 else loss, label=legend(r))
        for ax, m in zip(axes[1:], shown):
            ev = [e for e in r["evals"] if e.get(m.name) is not None]  # not measured: no point, never 0
            if ev:
                t = [e["clock_s"] / 60 for e in ev]
                line, = ax.plot(t, [e[m.name] for e in ev], marker="o", ms=3, label=legend(r))
                _interval_band(ax, t, ev, m.name, line.get_color())
    panels = [(axes[0], "training loss (Gaussian, sigma 10)", ())]
    panels += [(ax, f"validation {m.header}", _lines(runs, targets, m.name)) for ax, m in zip(axes[1:], shown)]
    for ax, title, targets in panels:
        for y in targets:
            ax.axhline(y, color="gray", ls=":", lw=1)
            ax.annotate(f"TTA target {y:g}", xy=(0.01, y), xycoords=("axes fraction", "data"), fontsize=7,
                        color="gray", va="bottom")
        ax.set_yscale("log")
        ax.set_xlabel("training time (minutes, TTA clock)")
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
    axes[1].legend(fontsize=8)
    return save_png(fig, path), ""


def _interval_band(ax, t: list[float], evals: list[dict], metric: str, color) -> None:
    """The evaluations' 95% bootstrap interval (scoring/bootstrap.py) shaded around the line,
    over the epochs that recorded one."""
    have = [(x, e[f"{metric}_lo"], e[f"{metric}_hi"]) for x, e in zip(t, evals)
            if e.get(f"{metric}_lo") is not None and e.get(f"{metric}_hi") is not None]
    if have:
        x, lo, hi = zip(*have)
        ax.fill_between(x, lo, hi, color=color, alpha=0.2, lw=0)


def _lines(runs: list[dict], targets: Targets, metric: str) -> list[float]:
    """The targets of ``metric`` over the runs' models (AlgoPerf's differ per model)."""
    return sorted({t for r in runs for t in targets.of(metric, r.get("workload", {}).get("model"))})


# Utilization metrics the sampler writes (telemetry/sampler.py) and their units. CPU: % of
# the whole machine (the paper's unit) and % of one core; ``util_pct`` is a GPU's, or the
# CPU's in % of one core in runs recorded before the CPU had two labelled series.
UTIL_UNITS = {"util_machine_pct": "% of the machine", "util_core_pct": "% of one core", "util_pct": "% of the GPU"}


def util_unit(source: str, metric: str) -> str:
    return "% of one core" if source == "cpu" and metric == "util_pct" else UTIL_UNITS[metric]


def utilization_window(runs: list[dict], path: Path, window_s: float = 25.0) -> tuple[Path | None, str]:
    """Fig. 8: a 25 s window of utilization, CPU solid (% of the whole machine, as the paper;
    runs recorded before that unit have % of one core, labelled so), each GPU dashed (middle
    of each run); the title gives each series' achieved sampling period."""
    have = [r for r in runs if any(s["source"] == "cpu" for s in r["samples"])]
    if not have:
        return None, "no utilization samples recorded"
    fig, axes = plt.subplots(len(have), 1, figsize=(12, 2.6 * len(have)), squeeze=False)
    for ax, r in zip(axes[:, 0], have):
        cpu_metric = "util_machine_pct" if any(s["metric"] == "util_machine_pct" for s in r["samples"]) else "util_pct"
        util = [s for s in r["samples"] if s["metric"] == "util_pct" and s["source"] != "cpu"
                or s["source"] == "cpu" and s["metric"] == cpu_metric]
        end = max(s["t"] for s in util)
        start = max(0.0, end / 2 - window_s / 2)
        for source in sorted({s["source"] for s in util}):
            pts = [(s["t"] - start, s["value"]) for s in util
                   if s["source"] == source and start <= s["t"] <= start + window_s]
            unit = util_unit(source, cpu_metric if source == "cpu" else "util_pct")
            if pts:
                ax.plot(*zip(*pts), ls="-" if source == "cpu" else "--", lw=1, label=f"{source} ({unit})")
        gpus = {s["source"] for s in util if s["source"].startswith("gpu")}
        periods = achieved_periods(util)
        every = ", ".join(f"{key.split(':')[0]} every {1000 * p['median_s']:.0f} ms (n = {p['count']})"
                          for key, p in periods.items() if p["median_s"])
        ax.set_title(f"{legend(r)}: utilization, 25 s window from t = {start:.0f} s"
                     + ("" if gpus else " (no GPU in this run)") + (f"\nsampled: {every}" if every else ""), fontsize=9)
        ax.set_xlabel("seconds")
        ax.legend(fontsize=8, loc="upper right")
        ax.grid(alpha=0.3)
    return save_png(fig, path), ""


def throughput(runs: list[dict], path: Path) -> tuple[Path | None, str]:
    """Fig. 9/10: utterances and audio seconds per second over time: per batch (thin) and
    averaged over windows of the TTA clock (bold), where evaluations show as dips."""
    if not any(r["iterations"] for r in runs):
        return None, "no training iterations recorded"
    fig, axes = plt.subplots(1, 2, figsize=(14, 4))
    for k, r in enumerate(runs):
        its = r["iterations"]
        if not its:
            continue
        color = f"C{k % 10}"
        t = [i["clock_s"] / 60 for i in its]
        for ax, key, amount in ((axes[0], "utts_per_s", "batch_size"), (axes[1], "audio_s_per_s", "audio_s")):
            ax.plot(t, [i[key] for i in its], lw=0.4, alpha=0.35, color=color)
            ax.plot(*_windowed(its, amount), lw=1.6, color=color, label=legend(r))
        for e in r["evals"]:  # evaluation periods: training stands still there
            for ax in axes:
                ax.axvspan((e["clock_s"] - e["eval_s"]) / 60, e["clock_s"] / 60, color="orange", alpha=0.2, lw=0)
    axes[0].set_title("utterances / s (thin: per batch; bold: moving average over clock time; orange: evaluation)",
                      fontsize=9)
    axes[1].set_title("audio seconds / s (same)", fontsize=9)
    for ax in axes:
        ax.set_xlabel("training time (minutes, TTA clock)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return save_png(fig, path), ""


def _windowed(its: list[dict], amount: str) -> tuple[list[float], list[float]]:
    """(minutes, amount per second of clock) over the last k batches (k = 1% of the run, >= 5):
    the clock of an evaluation between them lowers the rate, as the paper's throughput dips."""
    t = np.array([i["clock_s"] for i in its], dtype=float)
    done = np.cumsum([i[amount] or 0.0 for i in its])
    k = max(5, len(its) // 100)
    if len(its) <= k:
        return list(t / 60), [float("nan")] * len(its)
    rate = (done[k:] - done[:-k]) / np.maximum(t[k:] - t[:-k], 1e-9)  # batches k+1..n over their clock span
    return list(t[k:] / 60), list(rate)


def power_over_time(runs: list[dict], path: Path) -> tuple[Path | None, str]:
    """Power per source over time: GPUs from NVML or amdsmi (instant or averaged reading), CPU packages and
    DRAM from the differences of the RAPL energy counters."""
    have = [r for r in runs if any(s["metric"] in ("power_w", "power_avg_w", "energy_j") for s in r["samples"])]
    if not have:
        return None, "no run measured power (no NVML or amdsmi GPU, no readable RAPL counter)"
    fig, axes = plt.subplots(len(have), 1, figsize=(12, 2.6 * len(have)), squeeze=False)
    for ax, r in zip(axes[:, 0], have):
        for source, label, (t, watts) in _power_series(r["samples"]):
            ax.plot(t, watts, lw=0.8, ls="-" if source.startswith("rapl") else "--", label=f"{source} ({label})")
        ax.set_title(f"{legend(r)}: power")
        ax.set_xlabel("seconds since the sampler started")
        ax.set_ylabel("W")
        ax.legend(fontsize=8, loc="upper right")
        ax.grid(alpha=0.3)
    return save_png(fig, path), ""


def _power_series(samples: list[dict]):
    """(source, how measured, (t, W)) per source; RAPL W = energy difference / time difference."""
    sources = sorted({(s["source"], s["metric"]) for s in samples if s["metric"] in ("power_w", "power_avg_w")})
    for source, metric in sources:
        pts = sorted((s["t"], s["value"]) for s in samples if s["source"] == source and s["metric"] == metric)
        yield source, "instant" if metric == "power_w" else "driver average", tuple(map(list, zip(*pts)))
    rapl = {s["source"] for s in samples if s["metric"] == "energy_j" and s["source"].startswith("rapl")}
    for source in sorted(rapl):
        pts = sorted((s["t"], s["value"]) for s in samples if s["source"] == source and s["metric"] == "energy_j")
        rate = [((t0 + t1) / 2, (e1 - e0) / (t1 - t0)) for (t0, e0), (t1, e1) in zip(pts, pts[1:]) if t1 > t0]
        if rate:
            yield source, "RAPL counter", tuple(map(list, zip(*rate)))


PART_COLORS = {"steps": "tab:blue", "data": "tab:orange", "eval": "tab:red", "checkpoints": "tab:gray",
               "epoch changes": "tab:olive"}


def time_parts(rows: list[dict], path: Path) -> tuple[Path | None, str]:
    """Where the time to accuracy went: a stacked bar per run (studies/report/comparison.py ``time_rows``),
    seconds of training steps, waiting for data, evaluation, checkpoints and epoch changes, each
    labelled with the accelerator's busy share in them."""
    if not rows:
        return None, "no run has evaluations to break its time down to"
    fig, ax = plt.subplots(figsize=(8, 0.8 * len(rows) + 1.6))
    y = np.arange(len(rows))
    left = np.zeros(len(rows))
    for part, color in PART_COLORS.items():
        secs = np.array([r[f"{part} s"] for r in rows])
        ax.barh(y, secs, left=left, color=color, label=part)
        left += secs
    # each bar's label: the run (as legend() names it), how far, and how busy the accelerator was in those seconds
    ax.set_yticks(y, [(f"{r['run']} ({r['workload']})" if r.get("workload") else r["run"]) + f"\nto {r['to']}"
                      + (f"\n{r['busy']}" if r.get("busy") else "") for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds of the TTA clock")
    ax.set_title("Where the time to accuracy went")
    ax.legend(fontsize=8, ncol=len(PART_COLORS), loc="upper center", bbox_to_anchor=(0.5, -0.25))
    ax.grid(alpha=0.3, axis="x")
    return save_png(fig, path), ""


def cost_by_devices(costs: list[tuple[str, dict]], path: Path) -> tuple[Path | None, str]:
    """A training run's cost against device count, one line per ``speechperf cost --json`` output
    (``(name, cost)``): device-hours, dollars (where priced) and wall-clock hours, bars from the
    fastest to the slowest measured step's rate (studies/cost.py)."""
    if not any(c["curve"] for _, c in costs):
        return None, "the cost files hold no device counts"
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for k, (name, c) in enumerate(costs):
        curve = sorted(c["curve"], key=lambda r: r["devices"])
        n = [r["devices"] for r in curve]
        for ax, key in ((axes[0], "device_h"), (axes[1], "usd")):
            if any(r.get(key) is None for r in curve):
                continue
            y = np.array([r[key] for r in curve])
            err = [y - [r[f"{key}_low"] for r in curve], [r[f"{key}_high"] for r in curve] - y]
            ax.errorbar(n, y, yerr=err, marker="o", capsize=3, color=f"C{k % 10}", label=f"{name}: {c['workload']}")
        axes[2].plot(n, [r["wall_h"] for r in curve], marker="o", color=f"C{k % 10}", label=name)
    for ax, title in zip(axes, ("device-hours", "dollars (priced files only)", "wall-clock hours")):
        ax.set_title(title, fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("devices")
        ax.grid(alpha=0.3)
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=8)
    return save_png(fig, path), ""
