"""The report's sections: a registry of builders, filled by a decorator, drawn in ``order``.

A builder takes the report context (the loaded runs, the output folder, the open results
database) and returns a :class:`Section`: a title and blocks (figures, tables, notes). A
block with nothing to show carries the reason, which the page prints instead of empty axes
or an empty table. Other stages add sections by decorating a builder with
``register_section(name, order)`` in a module listed in ``SECTION_MODULES``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from speechperf.scoring.targets import Targets
from speechperf.registry import Registry
from speechperf.results import ResultsDB

# Modules whose import registers sections (per-run sections, then the database-wide ones here).
SECTION_MODULES = ("speechperf.studies.report.run_sections",)


@dataclass(frozen=True)
class Figure:
    name: str  # PNG file name in the report folder
    path: Path | None  # the drawn PNG, None when there was nothing to draw
    why: str = ""  # the reason when path is None
    caption: str = ""  # what the reader is looking at


@dataclass(frozen=True)
class Table:
    name: str  # CSV file name in the report folder
    rows: list[dict]  # the table; empty when not measured
    why: str = ""  # the reason when rows is empty


@dataclass(frozen=True)
class Note:
    text: str  # a paragraph of plain text (escaped when drawn)


@dataclass(frozen=True)
class Section:
    title: str  # heading
    blocks: list = field(default_factory=list)  # Figure, Table and Note blocks in page order


@dataclass(frozen=True)
class Context:
    runs: list[dict]  # load_run() of each run, in command-line order
    out: Path  # report folder (PNG and CSV files go here)
    db: ResultsDB  # the results database of the runs (bench and parallel tables too)
    targets: Targets = Targets()  # the TTA targets (a named set or numbers: scoring/targets.py)
    costs: tuple = ()  # (file name, its `speechperf cost --json` output) per report --cost FILE (studies/cost.py)


Builder = Callable[[Context], Section]
SECTIONS = Registry("report section", SECTION_MODULES)  # name -> (order, builder)


def register_section(name: str, order: int):
    """Register ``builder`` as section ``name``; sections are drawn by increasing ``order``."""
    return SECTIONS.register(name, lambda builder: (order, builder))


def ordered() -> list[tuple[str, Builder]]:
    return [(name, fn) for name, (_, fn) in sorted(SECTIONS.load().items(), key=lambda kv: kv[1][0])]


def _latest_sweep(ctx: Context, title: str, table: str, columns: str, missing: str) -> Section:
    """``columns`` of the latest sweep in bench table ``table``, or why there is none."""
    csv_name = f"{table.removeprefix('bench_')}.csv"
    if not ctx.db.has_table(table):
        return Section(title, [Table(csv_name, [], missing)])
    rows = ctx.db.query(f"SELECT {columns} FROM {table} WHERE at = (SELECT MAX(at) FROM {table})")
    return Section(title, [Table(csv_name, rows, "the latest sweep has no rows")])


@register_section("ops", 200)
def ops_section(ctx: Context) -> Section:
    return _latest_sweep(ctx, "Operators: achieved TFLOPS and % of peak (speechperf bench ops, latest sweep)",
                         "bench_ops", "device, dtype, threads, op, shape, iters, ms_mid, spread_pct, tflops, pct_peak, "
                         "peak_source, status",
                         "no operator benchmark in this database (speechperf bench ops --db ...)")


@register_section("zoo", 210)
def zoo_section(ctx: Context) -> Section:
    return _latest_sweep(ctx,
                         "Model zoo: training throughput, power and energy per sample (Table 8 form, latest sweep)",
                         "bench_zoo", "model, batch, precision, device, params_m, paper_params_m, unit, samples_per_s, "
                         "power_w, joules_per_sample, energy, status",
                         "no model-zoo benchmark in this database (speechperf bench zoo --db ...)")


@register_section("bench_figures", 220)
def bench_figures_section(ctx: Context) -> Section:
    from speechperf.bench.plots import draw_all  # heavy: matplotlib

    blocks = [Figure(f"{name}.png", path, why, caption=name.replace("_", " "))
              for name, path, why in draw_all(ctx.db, ctx.out)]
    return Section("Benchmark figures (zoo throughput vs batch, CPU thread scaling, % of peak)", blocks)


@register_section("parallel", 300)
def parallel_section(ctx: Context) -> Section:
    from speechperf.studies.speedups import report_rows  # loads torch (through config)

    title = "Parallel training algorithms: speedup, communication and WER (paper 003 Tables 1-5 form)"
    blocks = [Table("algorithms.csv", report_rows(ctx.runs),
                    "no workload among these runs has a run of a parallel algorithm beside its one-process runs "
                    "(speechperf parallel sweep, or train under torchrun with algo.name=...)")]
    return Section(title, blocks)


@register_section("cost", 320)
def cost_section(ctx: Context) -> Section:
    from speechperf.studies.report.figures import cost_by_devices  # heavy: matplotlib

    title = "Cost of a training run against device count (speechperf cost)"
    if not ctx.costs:
        why = "no cost data: give report --cost COST.json (a `speechperf cost ... --json` output)"
        return Section(title, [Figure("cost.png", None, why), Table("cost.csv", [], why)])
    path, why = cost_by_devices(ctx.costs, ctx.out / "cost.png")
    table = [{"file": name, "workload": c["workload"], **r} for name, c in ctx.costs for r in c["rows"]]
    notes = [Note(f"{name}: {line}") for name, c in ctx.costs for line in c["assumptions"]]
    return Section(title, [Figure("cost.png", path, why, caption="device-hours, dollars and wall hours against "
                                  "device count; bars: the fastest to the slowest measured step"),
                           Table("cost.csv", table, "no rows"), *notes])
