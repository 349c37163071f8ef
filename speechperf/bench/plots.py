"""Figures of the bench results for ``speechperf report``: zoo throughput against batch size
(FP32 beside mixed precision), CPU thread scaling of each operator, and % of peak per
operator and dtype.

Each function takes the rows of ``run_ops``/``run_zoo`` (or the same columns read back from
tables ``bench_ops``/``bench_zoo``) and a PNG path, and returns the path, or None with the
reason when the rows hold nothing to draw (the report then says so instead of empty axes).
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def save_png(fig, path: Path) -> Path:
    """Lay out, write and close ``fig`` (every figure of the report and the bench: one size, one dpi)."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _ok(rows: list[dict], value: str) -> list[dict]:
    return [r for r in rows if r.get("status") == "ok" and r.get(value)]


def zoo_throughput_vs_batch(rows: list[dict], path: Path) -> tuple[Path | None, str]:
    """One panel per model: samples/s against batch size, a line per precision and device."""
    rows = _ok(rows, "samples_per_s")
    if not rows:
        return None, "no successful zoo measurement"
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(4 * len(models), 3.4), squeeze=False)
    for ax, model in zip(axes[0], models):
        lines: dict[tuple, list] = defaultdict(list)
        for r in rows:
            if r["model"] == model:
                lines[(r["device"], r["precision"])].append((r["batch"], r["samples_per_s"]))
        for (device, precision), pts in sorted(lines.items()):
            pts.sort()
            ax.plot([b for b, _ in pts], [s for _, s in pts], marker="o", label=f"{device} {precision}")
        unit = next(r["unit"] for r in rows if r["model"] == model)
        ax.set_title(model)
        ax.set_xlabel("batch size")
        ax.set_ylabel(f"{unit} / s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save_png(fig, path), ""


def thread_scaling(rows: list[dict], path: Path) -> tuple[Path | None, str]:
    """Achieved GFLOPS of each CPU operator against the thread count (needs 2+ counts)."""
    rows = [r for r in _ok(rows, "tflops") if str(r["device"]).startswith("cpu")]
    if len({r["threads"] for r in rows}) < 2:
        return None, "the operator sweep ran at one thread count only (bench ops --threads 1,2,...)"
    lines: dict[tuple, list] = defaultdict(list)
    for r in rows:
        lines[(r["op"], r["shape"], r["dtype"])].append((r["threads"], 1000 * r["tflops"]))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (op, shape, dtype), pts in sorted(lines.items()):
        pts.sort()
        ax.plot([t for t, _ in pts], [g for _, g in pts], marker="o", lw=0.8, label=f"{op} {dtype} {shape}")
    ax.set_xlabel("threads")
    ax.set_ylabel("GFLOPS")
    ax.set_title("CPU thread scaling per operator")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    return save_png(fig, path), ""


def percent_of_peak(rows: list[dict], path: Path) -> tuple[Path | None, str]:
    """Horizontal bars: % of peak of each operator and dtype at the highest thread count."""
    rows = _ok(rows, "pct_peak")
    if not rows:
        return None, "no operator row has a known peak"
    top = max(r["threads"] for r in rows)
    rows = [r for r in rows if r["threads"] == top]
    labels = [f"{r['op']} {r['dtype']} {r['shape']}" for r in rows]
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.2))
    ax.barh(range(len(rows)), [r["pct_peak"] for r in rows], color="tab:blue")
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"% of peak ({rows[0]['peak_source'][:60]})")
    ax.set_title(f"{rows[0]['device']}, {top} threads")
    ax.grid(axis="x", alpha=0.3)
    return save_png(fig, path), ""


FIGURES = {"zoo_throughput_vs_batch": ("bench_zoo", zoo_throughput_vs_batch),
           "thread_scaling": ("bench_ops", thread_scaling),
           "percent_of_peak": ("bench_ops", percent_of_peak)}


def draw_all(db, out: Path) -> list[tuple[str, Path | None, str]]:
    """Every bench figure from the latest sweep of each table in ResultsDB ``db``:
    (name, PNG path or None, reason when None)."""
    drawn = []
    for name, (table, draw) in FIGURES.items():
        if not db.has_table(table):
            drawn.append((name, None, f"no {table} table in this database"))
            continue
        rows = db.query(f"SELECT * FROM {table} WHERE at = (SELECT MAX(at) FROM {table})")
        drawn.append((name, *draw(rows, Path(out) / f"{name}.png")))
    return drawn
