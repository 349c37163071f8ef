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

CER_TARGETS = (10.0, 8.0, 7.0)
WER_TARGETS = (22.0, 20.2, 19.2)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def loss_and_accuracy(runs: list[dict], path: Path) -> tuple[Path | None, str]:
    """Fig. 7: training loss (Gaussian-smoothed, sigma 10) and validation CER/WER over time, log y."""
    if not any(r["iterations"] for r in runs):
        return None, "no training iterations recorded"
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for r in runs:
        its = r["iterations"]
        if its:
            t = np.array([i["clock_s"] for i in its]) / 60
            loss = np.array([i["loss"] for i in its], dtype=float)
            axes[0].plot(t, gaussian_filter1d(loss, sigma=10) if len(loss) > 1 else loss, label=r["label"])
        ev = r["evals"]
        if ev:
            t = [e["clock_s"] / 60 for e in ev]
            axes[1].plot(t, [e["cer"] for e in ev], marker="o", ms=3, label=r["label"])
            axes[2].plot(t, [e["wer"] for e in ev], marker="o", ms=3, label=r["label"])
    for ax, title, targets in ((axes[0], "training loss (Gaussian, sigma 10)", ()),
                               (axes[1], "validation CER (standard) %", CER_TARGETS),
                               (axes[2], "validation WER %", WER_TARGETS)):
        for y in targets:
            ax.axhline(y, color="gray", ls=":", lw=1)
            ax.annotate(f"TTA target {y:g}", xy=(0.01, y), xycoords=("axes fraction", "data"), fontsize=7,
                        color="gray", va="bottom")
        ax.set_yscale("log")
        ax.set_xlabel("training time (minutes, TTA clock)")
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
    axes[1].legend(fontsize=8)
    return _save(fig, path), ""


def utilization_window(runs: list[dict], path: Path, window_s: float = 25.0) -> tuple[Path | None, str]:
    """Fig. 8: a 25 s window of utilization, CPU solid, each GPU dashed (middle of each run)."""
    have = [r for r in runs if any(s["source"] == "cpu" for s in r["samples"])]
    if not have:
        return None, "no utilization samples recorded"
    fig, axes = plt.subplots(len(have), 1, figsize=(12, 2.6 * len(have)), squeeze=False)
    for ax, r in zip(axes[:, 0], have):
        util = [s for s in r["samples"] if s["metric"] == "util_pct"]
        end = max(s["t"] for s in util)
        start = max(0.0, end / 2 - window_s / 2)
        for source in sorted({s["source"] for s in util}):
            pts = [(s["t"] - start, s["value"]) for s in util if s["source"] == source and start <= s["t"] <= start + window_s]
            if pts:
                ax.plot(*zip(*pts), ls="-" if source == "cpu" else "--", lw=1,
                        label=f"{source} ({'% of one core' if source == 'cpu' else '%'})")
        gpus = {s["source"] for s in util if s["source"].startswith("gpu")}
        ax.set_title(f"{r['label']}: utilization, 25 s window from t = {start:.0f} s"
                     + ("" if gpus else " (no GPU in this run)"))
        ax.set_xlabel("seconds")
        ax.legend(fontsize=8, loc="upper right")
        ax.grid(alpha=0.3)
    return _save(fig, path), ""


def throughput(runs: list[dict], path: Path) -> tuple[Path | None, str]:
    """Fig. 9/10: utterances and audio seconds per second, per batch, over time."""
    if not any(r["iterations"] for r in runs):
        return None, "no training iterations recorded"
    fig, axes = plt.subplots(1, 2, figsize=(14, 4))
    for r in runs:
        its = r["iterations"]
        if not its:
            continue
        t = [i["clock_s"] / 60 for i in its]
        axes[0].plot(t, [i["utts_per_s"] for i in its], lw=0.6, label=r["label"])
        axes[1].plot(t, [i["audio_s_per_s"] for i in its], lw=0.6, label=r["label"])
        for e in r["evals"]:  # evaluation periods: training stands still there
            for ax in axes:
                ax.axvspan((e["clock_s"] - e["eval_s"]) / 60, e["clock_s"] / 60, color="orange", alpha=0.25, lw=0)
    axes[0].set_title("throughput: utterances / s per batch (orange: evaluation)")
    axes[1].set_title("throughput: audio seconds / s per batch")
    for ax in axes:
        ax.set_xlabel("training time (minutes)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return _save(fig, path), ""
