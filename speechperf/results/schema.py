"""Every table of the results database, in one place.

A run folder's own ``results.db`` and a shared collection database (``--db``) have the same
schema: :class:`speechperf.results.ResultsDB` creates every table when it opens a file for
writing, so a reader never meets a database without the table it asks for (a database
written before a table was added lacks it: readers check ``has_table``).
Columns are only ever added (results/upgrade.py's ``ADDED_COLUMNS``), never renamed.
"""
from __future__ import annotations

from speechperf import metric

RUNS = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,      -- unique name (the run folder's name plus a short hash)
    kind TEXT NOT NULL,           -- 'train', 'parallel'
    preset TEXT,
    seed INTEGER,
    platform TEXT,                -- platform name (detected or given)
    out_dir TEXT,                 -- run folder as it was when the run started (a hint: folders move)
    config_json TEXT,             -- RunConfig.to_dict()
    env_json TEXT,                -- hardware and library versions
    started_at REAL,              -- unix time the run (its folder) was created
    status TEXT,                  -- 'running', 'success', 'time_cap', 'max_epochs', 'failed'
    label TEXT                    -- the run's label in tables and legends
);
"""

ITERATIONS = """
CREATE TABLE IF NOT EXISTS iterations (
    run_id TEXT, iteration INTEGER, epoch INTEGER,
    clock_s REAL,                 -- TTA clock (seconds since run_start, after initialization; down time excluded)
    loss REAL, batch_size INTEGER, frames INTEGER, audio_s REAL,
    step_s REAL, utts_per_s REAL, audio_s_per_s REAL,
    model_flops REAL,             -- the batch's training FLOPs, valid frames only (hardware/mfu.py)
    comm_s REAL,                  -- rank 0's communication seconds in the step (speechperf/algorithms;
                                  -- NULL: results/upgrade.py)
    comm_bytes INTEGER,           -- bytes rank 0 sent in the step (an all-reduce counted once)
    data_s REAL,                  -- of step_s, seconds waiting for the loader's batch (NULL: upgrade.py)
    ckpt_s REAL,                  -- seconds writing checkpoints since the previous row: inside step_s, but for an
                                  -- epoch's first row (those at the epoch's end) (NULL: upgrade.py)
    PRIMARY KEY (run_id, iteration)
);
"""

# The metric columns of evals: one per declared metric and its interval's ends (speechperf/metric.py);
# a database written before a metric existed gets its columns as results/upgrade.py adds them, NULL
# in its older rows.
EVALS_METRICS = metric.columns()
# An evaluation's seconds by part (train/evaluate.py): the pass over the batches (loading, forward,
# loss; the decodes run beside it), the wait for the decodes after it, the scoring. Sum: eval_s.
EVALS_PARTS = ("eval_forward_s", "eval_decode_s", "eval_score_s")
# How its decodes ran (decode/batch.py's DecodePool): threads, valid frames, thread-seconds inside the
# decoder and their CPU seconds (below the thread-seconds where the threads waited for a core or the GIL)
EVALS_DECODE = {"decode_threads": "INTEGER", "decode_frames": "INTEGER", "decode_busy_s": "REAL",
                "decode_cpu_s": "REAL"}
EVALS = f"""
CREATE TABLE IF NOT EXISTS evals (
    run_id TEXT, epoch INTEGER, split TEXT, decoder TEXT, beam INTEGER,
    clock_s REAL,                 -- TTA clock when the evaluation finished
    eval_s REAL,                  -- seconds the evaluation took (not training time)
    {", ".join(f"{c} REAL" for c in EVALS_PARTS)},  -- its parts (EVALS_PARTS)
    {", ".join(f"{c} {t}" for c, t in EVALS_DECODE.items())},  -- its decodes (EVALS_DECODE; NULL: upgrade.py)
    loss REAL, n_utts INTEGER,
    final INTEGER DEFAULT 0,      -- 1 for the final evaluation after training
    {", ".join(f"{c} REAL" for c in EVALS_METRICS)},
    PRIMARY KEY (run_id, epoch, split, decoder, beam, final)
);
"""

SAMPLES = """
CREATE TABLE IF NOT EXISTS samples (
    run_id TEXT, t REAL, source TEXT, metric TEXT, value REAL,
    segment REAL                  -- unix time the stretch of the TTA clock began (a process's sampler start, or the
                                  -- end of time kept off the clock): counters are differenced only within one
                                  -- (telemetry/energy.py); NULL: results/upgrade.py
);
CREATE INDEX IF NOT EXISTS samples_run ON samples (run_id, source, metric);
"""

# beam_sweep holds the same metric columns as evals (a database written before a metric existed
# gets them as results/upgrade.py adds them, NULL in its older rows).
BEAM_SWEEP = f"""
CREATE TABLE IF NOT EXISTS beam_sweep (
    run_id TEXT, split TEXT, decoder TEXT, beam INTEGER,
    eval_s REAL, n_utts INTEGER, device TEXT,
    {", ".join(f"{c} REAL" for c in EVALS_METRICS)},
    PRIMARY KEY (run_id, split, decoder, beam)
);
"""

BENCH_ZOO = """
CREATE TABLE IF NOT EXISTS bench_zoo (
    at REAL, model TEXT, batch INTEGER, precision TEXT, multiply TEXT, accumulate TEXT, device TEXT, libraries TEXT,
    params_m REAL, paper_params_m REAL, unit TEXT,
    samples_per_s REAL, step_s REAL, iters INTEGER, spread_pct REAL, power_w REAL, joules_per_sample REAL,
    energy TEXT, torch TEXT, threads INTEGER,
    status TEXT,
    warmup_steps INTEGER, warmup_s REAL, warm INTEGER, window_s REAL, repeats INTEGER, repeat_iqr_pct REAL,
    noisy INTEGER, timer TEXT,
    precision_note TEXT, tflops REAL, mfu_pct REAL, peak_tflops REAL, peak_source TEXT, mfu_note TEXT
);
"""

BENCH_OPS = """
CREATE TABLE IF NOT EXISTS bench_ops (
    at REAL, device TEXT, dtype TEXT, accumulate TEXT, threads INTEGER, op TEXT, shape TEXT, gflop REAL,
    iters INTEGER, ms_mid REAL, ms_median REAL, spread_pct REAL, tflops REAL, pct_peak REAL,
    peak_tflops REAL, peak_source TEXT, torch TEXT, libraries TEXT, power_w REAL, joules_per_call REAL,
    gflops_per_w REAL,
    energy TEXT, status TEXT, measured_peak_tflops REAL, pct_measured_peak REAL, env_json TEXT,
    warmup_steps INTEGER, warmup_s REAL, warm INTEGER, window_s REAL, repeats INTEGER, repeat_iqr_pct REAL,
    noisy INTEGER, timer TEXT,
    precision_note TEXT
);
"""

# name -> DDL; ResultsDB runs them all (idempotent) when it opens a database for writing.
TABLES = {"runs": RUNS, "iterations": ITERATIONS, "evals": EVALS, "samples": SAMPLES, "beam_sweep": BEAM_SWEEP,
          "bench_zoo": BENCH_ZOO, "bench_ops": BENCH_OPS}
ALL = "".join(TABLES.values())
