"""Report sections read straight from results-database tables of the other jobs (bench ops,
bench zoo, parallel sweeps), in a registry filled by a decorator: each returns its title
and rows, or no rows when the database holds none (the report then says so)."""
from __future__ import annotations

from typing import Callable

from speechperf.results import ResultsDB

SECTIONS: dict[str, Callable[[ResultsDB], tuple[str, list[dict], str]]] = {}


def register_section(name: str):
    def deco(fn):
        SECTIONS[name] = fn
        return fn
    return deco


def _has(db: ResultsDB, table: str) -> bool:
    return bool(db.query("SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?", [table]))


@register_section("ops")
def ops_section(db: ResultsDB):
    title = "Operators: achieved TFLOPS and % of peak (speechperf bench ops, latest sweep)"
    if not _has(db, "bench_ops"):
        return title, [], "no operator benchmark in this database (speechperf bench ops --db ...)"
    rows = db.query("SELECT device, dtype, threads, op, shape, iters, ms_mid, spread_pct, tflops, pct_peak, "
                    "peak_source, status FROM bench_ops WHERE at = (SELECT MAX(at) FROM bench_ops)")
    return title, rows, ""


@register_section("zoo")
def zoo_section(db: ResultsDB):
    title = "Model zoo: training throughput, power and energy per sample (Table 8 form, latest sweep)"
    if not _has(db, "bench_zoo"):
        return title, [], "no model-zoo benchmark in this database (speechperf bench zoo --db ...)"
    rows = db.query("SELECT model, batch, precision, device, params_m, paper_params_m, unit, samples_per_s, power_w, "
                    "joules_per_sample, energy, status FROM bench_zoo WHERE at = (SELECT MAX(at) FROM bench_zoo)")
    return title, rows, ""


@register_section("parallel")
def parallel_section(db: ResultsDB):
    from speechperf.parallel.sweep import table

    title = "Parallel training algorithms: speedup, communication and WER (paper 003 Tables 1-5 form)"
    if not _has(db, "parallel_runs"):
        return title, [], "no parallel sweep in this database (speechperf parallel sweep ...)"
    return title, table(db.query("SELECT * FROM parallel_runs ORDER BY model, batch, algo, workers, sync_period")), ""
