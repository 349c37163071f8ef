"""The hardware benchmarks: ``bench ops``, ``bench zoo``, ``bench feed`` and ``bench scale``; each one's
arguments declared right above it."""
from __future__ import annotations

import argparse
from pathlib import Path

from speechperf.bench.outcome import check_measured
from speechperf.cli.parsing import WIDTH, Command, Registry, csv_list, named, preset
from speechperf.tables import emit, pick, print_lines

# The default text tables' columns (key: the header shown), to fit 100 columns; --wide shows
# each module's COLUMNS, --json, --csv and the database every column.
OPS_NARROW = {"dtype": "dtype", "threads": "thr", "op": "op", "shape": "shape", "ms_median": "ms", "tflops": "TFLOPS",
              "pct_peak": "% peak", "pct_measured_peak": "% best", "power_w": "W", "status": "status"}
ZOO_NARROW = {"model": "model", "batch": "batch", "precision": "prec", "device": "device", "samples_per_s": "samples/s",
              "mfu_pct": "MFU %", "step_s": "step s", "power_w": "W", "joules_per_sample": "J/sample",
              "status": "status"}
FEED_NARROW = {"preset": "preset", "batch": "batch", "mean utt s": "mean utt s", "appetite audio s/s": "appetite s/s",
               "supply audio s/s per reader": "supply s/s/reader", "readers per GPU": "readers/GPU",
               "host cores": "cores", "GPUs this host feeds": "GPUs fed"}
SCALE_NARROW = {"workload": "workload", "params_m": "M params", "batch_s": "batch s", "utterances": "utts",
                "audio_s_per_s": "audio s/s", "utt_per_s": "utt/s", "mfu_pct": "MFU %", "peak_gb": "peak GB",
                "estimate_gb": "est GB", "power_w": "W", "wh_per_audio_h": "Wh/audio h", "world": "devices",
                "scaling_efficiency": "eff", "status": "status"}


def _table(a, rows: list[dict], columns, narrow: dict[str, str], lines: list[str] | None) -> None:
    """``rows`` as --json, --wide (``columns``, whole) or the narrow default (``narrow``), then
    the notes under a text table (``lines``: a bench's own ``notes``)."""
    if a.json or a.wide:
        emit(rows, a.json, columns=columns, width=None)
    else:
        emit(pick(rows, narrow), False, width=WIDTH)
    if not a.json:
        print_lines(lines, None if a.wide else WIDTH)


def _zoo_models():
    from speechperf.bench.zoo import ZOO  # torch: read when --help shows the names

    return ZOO


def _dtypes():
    from speechperf.bench.ops import DTYPES  # torch: read when --help shows them

    return DTYPES


class _ZooNames(Registry):
    """The zoo's models, and any ``MODULE:NAME``: a model outside the package, which ``run_zoo``
    imports and checks (exit 2 naming it where it falls short)."""

    def __contains__(self, name) -> bool:
        return ":" in name or super().__contains__(name)


ZOO_MODELS, DTYPE_NAMES = _ZooNames(_zoo_models), Registry(_dtypes)
ZOO_PRECISIONS = ("fp32", "amp")


def _timing_args(sp, what: str) -> None:
    """The measurement method's options (speechperf/telemetry/timing.py; defaults per device there)."""
    sp.add_argument("--seconds", "--cpu-seconds", type=float, default=None,
                    help=f"timed seconds per {what} without --iters (default: per device, docs/bench.md)")
    sp.add_argument("--warmup-seconds", type=float, default=None,
                    help="warm-up budget when the step time is not yet stable")
    sp.add_argument("--repeats", type=int, default=None,
                    help="consecutive windows the timed steps are split into (default 3)")
    sp.add_argument("--energy-min-seconds", type=float, default=None,
                    help="shortest window given power and energy (default 2; shorter: none, with the reason)")


def _bench_ops_args(sp) -> None:
    sp.add_argument("--device", default="cpu")
    named(sp.add_argument("--dtype", type=csv_list(choices=DTYPE_NAMES), default=None,
                          help="data types, comma separated (%(dtypes)s); default fp32, and bf16 where the device "
                               "runs it natively (AMX or AVX512-BF16 on a CPU), its peak beside fp32's"),
          dtypes=DTYPE_NAMES)
    sp.add_argument("--threads", type=csv_list(int), default=None)
    sp.add_argument("--iters", type=int, default=None)
    sp.add_argument("--quick", action="store_true", help="small shapes only (smoke test)")
    _timing_args(sp, "op")
    sp.add_argument("--csv", help="also write the rows to this CSV file")
    sp.add_argument("--db")


def cmd_bench_ops(a) -> int:
    from speechperf.bench.ops import COLUMNS, notes, run_ops  # torch: this command's only

    rows = run_ops(device=a.device, dtypes=a.dtype, threads=a.threads, iters=a.iters, db_path=a.db, quick=a.quick,
                   seconds=a.seconds, csv_path=a.csv, warmup_seconds=a.warmup_seconds, repeats=a.repeats,
                   energy_min_seconds=a.energy_min_seconds)
    _table(a, rows, COLUMNS, OPS_NARROW, notes(rows))
    check_measured(rows, "bench ops")  # nothing measured: exit 1, the causes in words
    return 0


def _bench_zoo_args(sp) -> None:
    named(sp.add_argument("--models", type=csv_list(choices=ZOO_MODELS), default=None,
                          help="models, comma separated (%(models)s, or MODULE:NAME; default: all)"), models=ZOO_MODELS)
    sp.add_argument("--batch", type=csv_list(int), default=None,
                    help="batch sizes, comma separated (default: per model)")
    sp.add_argument("--precision", type=csv_list(choices=ZOO_PRECISIONS), default=["fp32"],
                    help=f"precisions, comma separated ({', '.join(ZOO_PRECISIONS)})")
    sp.add_argument("--device", default="cpu")
    sp.add_argument("--iters", type=int, default=None)
    sp.add_argument("--warmup", type=int, default=None, help="untimed steps at least (default: 3 on a GPU, 1 on a CPU)")
    _timing_args(sp, "row")
    sp.add_argument("--csv", help="Table 8 layout CSV (default: bench_zoo_table8.csv beside --db)")
    sp.add_argument("--db")


def cmd_bench_zoo(a) -> int:
    from speechperf.bench.zoo import COLUMNS, notes, run_zoo  # torch: this command's only

    rows = run_zoo(models=a.models, batches=a.batch, precisions=a.precision, device=a.device, iters=a.iters,
                   db_path=a.db, csv_path=a.csv, warmup=a.warmup, seconds=a.seconds, warmup_seconds=a.warmup_seconds,
                   repeats=a.repeats, energy_min_seconds=a.energy_min_seconds)
    _table(a, rows, COLUMNS, ZOO_NARROW, notes(rows))
    check_measured(rows, "bench zoo")  # nothing measured: exit 1, the causes in words
    return 0


def _bench_feed_args(sp) -> None:
    sp.add_argument("--preset", default="gpu", type=preset, metavar="PRESET", help="named preset or a TOML file")
    sp.add_argument("--data", default=None, help="prepared features to read (default: a synthetic shard set at "
                    "LibriSpeech lengths in a temporary folder)")
    sp.add_argument("--device", default="auto", help="where the appetite is measured: auto (a GPU when torch sees "
                    "one, else the recorded profile's figure), cuda, cuda:N or cpu")
    sp.add_argument("--profile", default=None, help="recorded GPU profile (speechperf/config/gpu_appetite.toml; "
                    "default: its first) when no GPU measures the appetite")
    sp.add_argument("--readers", type=int, default=1, help="reader processes timed together (the supply is per reader)")
    sp.add_argument("--windows", type=int, default=3, help="timed windows of each measurement (median and spread): "
                    "appetite windows of --steps steps; supply spans of --readers whole loader windows, after one")
    sp.add_argument("--steps", type=int, default=5, help="training steps per appetite window")
    sp.add_argument("--warmup", type=int, default=3, help="untimed training steps first")
    sp.add_argument("--cores", type=int, default=None, help="the host's cores (default: os.cpu_count())")
    sp.add_argument("overrides", nargs="*", help="key=value overrides of the preset (e.g. loader.batch_size=64)")


def cmd_bench_feed(a) -> int:
    from speechperf.bench.feed import COLUMNS, notes, run_feed  # torch: this command's only

    row = run_feed(a.preset, a.overrides, data=Path(a.data) if a.data else None, device=a.device, profile=a.profile,
                   readers=a.readers, windows=a.windows, steps=a.steps, warmup=a.warmup,
                   cores=a.cores)
    _table(a, [row], COLUMNS, FEED_NARROW, notes(row))
    return 0


def _bench_scale_args(sp) -> None:
    sp.add_argument("--workloads", type=csv_list(), default=None,
                    help="at-scale presets, comma separated (default: fastconformer-l, fastconformer-xl, "
                    "parakeet-rnnt-sizes, canary-aed-sizes)")
    sp.add_argument("--batch-seconds", type=csv_list(float), default=None,
                    help="seconds of audio per batch (loader.max_duration), comma separated (default: 30 on a CPU, "
                    "the preset's on a GPU)")
    sp.add_argument("--steps", type=int, default=3, help="timed training steps per row")
    sp.add_argument("--warmup", type=int, default=1, help="untimed training steps first")
    sp.add_argument("--device", default="cpu")
    sp.add_argument("--precision", default=None, choices=("fp32", "bf16", "fp16", "fp8"),
                    help="default: fp32 on a CPU, the preset's on a GPU (fp8: torchao's float8, emulated on a CPU)")
    sp.add_argument("--world", type=int, default=1,
                    help="devices: N > 1 also measures the rows sharded (FSDP2) over N torchrun ranks, started here "
                    "on one node (a CPU: N shares of its cores), with the scaling efficiency against one device; "
                    "under torchrun, N = its WORLD_SIZE")
    sp.add_argument("--memory-limit-gb", type=float, default=None,
                    help="rows whose estimated peak exceeds this are not run (default: the device's free memory)")
    sp.add_argument("--no-memory", action="store_true", help="skip the measured peak (one profiled step a row)")
    sp.add_argument("--baseline", type=Path, default=None,
                    help="a saved bench scale --json: its one-device rows are the N-device rows' baseline instead of "
                    "measuring them here (under a torchrun of several nodes: the only way to an efficiency)")
    sp.add_argument("--rows-if-none-fit", action="store_true", help=argparse.SUPPRESS)  # scale_launch's child
    sp.add_argument("overrides", nargs="*", help="key=value overrides of every workload's preset")


def cmd_bench_scale(a) -> int:
    from speechperf.bench.scale import COLUMNS, WORKLOADS, Request, notes  # torch: this command's only
    from speechperf.bench.scale_launch import measure

    req = Request(tuple(a.workloads or WORKLOADS), tuple(a.batch_seconds) if a.batch_seconds else None, a.steps,
                  a.warmup, a.device, a.precision, a.world, a.memory_limit_gb, not a.no_memory, tuple(a.overrides))
    rows = measure(req, refuse_unfit=not a.rows_if_none_fit, baseline=a.baseline)
    if not rows:  # a torchrun rank other than 0: rank 0 prints the rows
        return 0
    _table(a, rows, COLUMNS, SCALE_NARROW, notes(rows))
    check_measured(rows, "bench scale")
    return 0


GROUPS = {"bench": "accelerator characterization"}
COMMANDS = [
    Command("ops", "operator FLOPS against peak", cmd_bench_ops, _bench_ops_args, group="bench"),
    Command("zoo", "model-zoo training throughput, power and energy", cmd_bench_zoo, _bench_zoo_args, group="bench"),
    Command("feed", "how many CPU cores feed one GPU: the preset's training step's appetite (audio s/s on batches "
            "on the device, LibriSpeech lengths) against the loader's supply per reader", cmd_bench_feed,
            _bench_feed_args, group="bench"),
    Command("scale", "the at-scale workloads (FastConformer L and XL; CTC, RNN-T and AED): audio s/s, MFU, peak "
            "memory beside its estimate, energy per audio hour, batches by duration at LibriSpeech's lengths",
            cmd_bench_scale, _bench_scale_args, group="bench"),
]
