"""Commands that train: ``train`` (one run, or one per seed), ``parallel sweep``, ``reproduce``
and ``demo``; each one's arguments declared right above it."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from speechperf import metric
from speechperf.cli.parsing import (PRESETS, TRAIN_KEYS, WIDTH, Command, named, preset, trust_model_arg, trust_models,
                                     width)
from speechperf.cli.result_commands import error_column
from speechperf.errors import SpeechperfError
from speechperf.tables import emit, emit_json, notes, print_lines
from speechperf.telemetry import contention
from speechperf.studies import tta_text
from speechperf.studies.precisions import choice_words
from speechperf.hardware.isa_cap import CAPS, exec_capped


def _seeds(text: str):
    """--seeds: a count N (seeds 1..N), a list 3,7 or a range 6-10 (drive/seeds.py)."""
    from speechperf.drive.seeds import parse_seeds  # torch: loaded only where --seeds is given

    try:
        return parse_seeds(text)
    except SpeechperfError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _isa_arg(sp) -> None:
    sp.add_argument("--isa", choices=sorted(CAPS), default=None,
                    help="cap the instruction set of oneDNN and of torch's own kernels and fix MKL's code path "
                         "(ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY and MKL_CBWR=COMPATIBLE; the command restarts "
                         "itself under them): with train.system.threads=1, a "
                         "reference seed's curve is reproducible bit for bit (docs/reproduce.md)")


def _isa_cap(a) -> None:
    """--isa: this command again, the process replaced by one under the whole cap (hardware/isa_cap.py)."""
    exec_capped(a.isa, sys.argv[1:])


def _allow_emulated_arg(sp) -> None:
    sp.add_argument("--allow-emulated", action="store_true",
                    help="train in a precision this CPU only emulates (bf16 without AVX512-BF16 or AMX: many times "
                         "slower than fp32); refused without it (exit 2). train.system.precision=auto never picks one")


def _train_args(sp) -> None:
    _isa_arg(sp)
    named(sp.add_argument("--preset", default="cpu", type=preset, metavar="PRESET",
                          help="named preset (%(presets)s) or a TOML file"), presets=PRESETS)
    sp.add_argument("--data", help="prepared features folder")
    sp.add_argument("--out", help="run folder")
    sp.add_argument("--resume", default="auto",
                    help="auto: continue a run of the same configuration in --out from its last checkpoint (a "
                         "finished one is only reported; another configuration is refused); yes: insist; no: refuse "
                         "an existing run; or a run folder to continue with its own configuration")
    sp.add_argument("--label", help="the run's name in tables and legends (default: machine, preset, precision, "
                                    "e.g. 'H100x1 paper bf16')")
    sp.add_argument("--platform", help="platform profile (a name from `speechperf platforms`, or FILE.toml): its "
                    "prices, and its loader values where it has them (sys1, sys2, sys10)")
    sp.add_argument("--db", help="a shared results database that also receives the rows (the run folder keeps its "
                                 "own RUN/results.db)")
    sp.add_argument("--seeds", type=_seeds, default=None, metavar="SEEDS",
                    help="train the recipe once per seed, one after another, each in its own run folder --out/seed-S "
                         "(train.seed=S): a count N (seeds 1..N), a list 3,7 or a range 6-10; the same command "
                         "continues an interrupted seed and only reads finished ones; the first seed that fails stops "
                         "it (exit 1). Without it, --out is the run folder")
    sp.add_argument("--label-suffix", default="", help=argparse.SUPPRESS)  # a seed of --parallel: " seed S"
    sp.add_argument("--parallel", type=int, default=1, metavar="K",
                    help="with --seeds: train K seeds at once, each its own process: one GPU each where CUDA is "
                         "(K at most the GPUs visible), else the CPUs shared (train.system.threads = CPUs // K unless "
                         "given); each seed's output in --out/seed-S.log; a failed seed stops the others, saved")
    _allow_emulated_arg(sp)
    trust_model_arg(sp)
    sp.add_argument("overrides", nargs="*", help="key=value or section.key=value")


def cmd_train(a) -> int:
    from speechperf.studies.study import run_check  # torch: the commands that train
    from speechperf.train.distributed import DistEnv  # torch, as the loop
    from speechperf.train.loop import RESUME_MODES, TrainRequest, train  # torch, mlperf-logging: as above

    _isa_cap(a)
    trust_models(a, a.overrides)
    request = TrainRequest(preset=a.preset, data=a.data or None, out=a.out or None, overrides=a.overrides,
                           resume=a.resume, db_path=a.db or None, quiet=a.json, platform=a.platform, label=a.label,
                           label_suffix=a.label_suffix, check=run_check, allow_emulated=a.allow_emulated)
    if a.seeds is not None:
        return _train_seeds(a, request, RESUME_MODES)
    if a.parallel != 1:
        raise SpeechperfError(f"--parallel {a.parallel} without --seeds: it places seeds side by side; one run "
                              "trains with all the devices it is given (torchrun for several)")
    result = train(request)
    # every rank of a torchrun job returns rank 0's summary (one exit status); one prints it
    if DistEnv.from_env().rank == 0:
        _emit_summaries([result], a.json, width(a))
    return 0 if result.get("status") in ("success", "time_cap", "max_epochs") else 1


def _emit_summaries(results: list[dict], as_json: bool, fit: int | None = WIDTH) -> None:
    """The runs' summaries: --json every field; as text one narrow row a run (its nested records,
    the floor's and the convergence check's, stay in summary.json) and its long notes below,
    fitting ``fit`` columns (None: --wide, whole)."""
    if as_json:
        return emit(results, True)
    # short headers for the text (the fields keep their names in --json and summary.json); the
    # status's word in the row ("diverged"), its reason below it as a note, whole
    rows = [{**r, **_status_columns(r.get("status")), "iters": r.get("iterations"), "min": r.get("clock_min"),
             "mfu %": r.get("mfu_pct"), "loop/floor": (r.get("floor") or {}).get("loop_over_floor"),
             "shared": contention.short(r.get("shared")), "shared_note": contention.words(r.get("shared")),
             **{m: r.get(f"last_{m}") for m in metric.targets()}} for r in results]
    emit(rows, False, width=fit, columns=[*(["seed"] if "seed" in rows[0] else []), "run", "status", "epochs",
                                          "iters", "min", "shared", *metric.targets(), "mfu %", "loop/floor"])
    for r in rows:
        r["precision_choice_note"] = choice_words(r.get("precision_choice"))
    for column in ("status_note", "precision_choice_note", "mfu_note", "precision_note", "shared_note"):
        notes(rows, column, width=fit)


def _status_columns(status: str | None) -> dict:
    """The status's word for the row ("diverged"), and the whole status as its note where it
    carries a reason ("diverged: non-finite loss ..."); a missing status stays missing (NA)."""
    if not isinstance(status, str):
        return {"status": status, "status_note": None}
    return {"status": status.split(":")[0], "status_note": status if ":" in status else None}


def _train_seeds(a, request, resume_modes) -> int:
    """``train --seeds``: one run folder per seed under --out; a seed that fails stops the
    command (train_seeds raises: exit 1 naming the seed's folder)."""
    from speechperf.drive.seeds import train_seeds  # torch: the commands that train
    from speechperf.train.distributed import DistEnv  # torch, as train_seeds

    if a.resume not in resume_modes:
        raise SpeechperfError(f"--resume {a.resume} with --seeds: --resume takes {', '.join(resume_modes)} there "
                              "(each seed's folder is continued as the same command continues one run)")
    env = DistEnv.from_env()
    rank0 = env.rank == 0
    say = print if rank0 and not a.json else None
    say_seeds = (lambda msg: say(f"[seeds] {msg}", flush=True)) if say else None
    if a.parallel > 1:
        from speechperf.drive.seed_slots import train_seeds_parallel  # torch: seeds side by side only

        if env.world > 1:
            raise SpeechperfError("--parallel places one seed per device itself: run it without torchrun")
        results = train_seeds_parallel(a.seeds, a.parallel, request, say=say_seeds)
    else:
        results = train_seeds(a.seeds, request, say=say_seeds)
    if rank0:
        _emit_summaries(results, a.json, width(a))
    return 0



def sweep_parser(add_help: bool = True) -> argparse.ArgumentParser:
    """The sweep's options: checked and shown under ``speechperf parallel sweep``, then parsed
    again from the words given after ``sweep`` (``--json`` aside) into a ``drive.sweep.Sweep``."""
    p = argparse.ArgumentParser(prog="speechperf parallel sweep", add_help=add_help,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", required=True, help="prepared features folder")
    p.add_argument("--out", required=True, help="sweep folder (one run folder per algorithm and worker count)")
    p.add_argument("--preset", default="tiny", help="the preset every run trains (or a TOML file)")
    p.add_argument("--algos", default="sync,bsp,bmuf,diloco", help="algorithms (algo.name), comma separated")
    p.add_argument("--workers", default="2", help="worker (process) counts, comma separated")
    p.add_argument("--sync-every", default="20", help="algo.sync_every of bsp, bmuf and diloco, comma separated")
    p.add_argument("--db", default=None, help="shared results database (default: OUT/results.db)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an override of every run (repeat it: --set max_epochs=3 --set threads=1)")
    return p


def sweep_request(argv: list[str]):
    """The sweep ``argv`` asks for (``Sweep``)."""
    from speechperf.drive.sweep import Sweep  # torch: the sweep's commands only

    a = sweep_parser().parse_args(argv)
    return Sweep(data=a.data, out=a.out, preset=a.preset, algos=a.algos, workers=a.workers,
                 sync_every=a.sync_every, db=a.db, overrides=a.set)


def _sweep_parents() -> list[argparse.ArgumentParser]:
    return [sweep_parser(add_help=False)]  # its options are checked and shown here, and passed on as given


def cmd_parallel_sweep(a) -> int:
    from speechperf.drive.sweep import run_sweep  # torch: this command's only

    rows = run_sweep(sweep_request(a.rest))
    emit(rows, a.json, width=width(a))
    return 0


def _reproduce_args(sp) -> None:
    sp.add_argument("preset", help="a preset with reference curves (speechperf/config/rcp/PRESET.json)")
    sp.add_argument("--data", required=True, help="prepared features (the reference's corpus: see docs/reproduce.md)")
    sp.add_argument("--seed", type=int, default=None, help="reference seed (default: the first with a curve)")
    sp.add_argument("--epochs", type=int, default=2, help="epochs to train and compare")
    sp.add_argument("--out", default=None, help="keep the run in this new folder (default: a temporary one)")
    sp.add_argument("--prepare", default=None, metavar="CORPUS",
                    help="where --data is not the features of any reference curve, prepare CORPUS into DATA-reproduce "
                         "and reproduce on that")


def cmd_reproduce(a) -> int:
    from speechperf.drive.reproduce import EXIT, reproduce  # torch: this command's only

    result = reproduce(a.preset, Path(a.data), seed=a.seed, epochs=a.epochs, out=Path(a.out) if a.out else None,
                       quiet=a.json, corpus=Path(a.prepare) if a.prepare else None)
    if a.json:
        emit_json(result)
    else:
        if result["epochs"]:
            emit(result["epochs"], False, width=width(a))
        print_lines([f"{a.preset} seed {result['seed']}: {result['text']}"], width(a))
    return EXIT[result["verdict"]]


def _demo_args(sp) -> None:
    _isa_arg(sp)
    sp.add_argument("--out", default="demo")
    sp.add_argument("--hours", type=float, default=None, help="hours of training audio (default: the preset's)")
    sp.add_argument("--minutes", type=float, default=None, help="training time cap (default: the preset's)")
    named(sp.add_argument("--preset", default=None, type=preset, metavar="PRESET",
                          help="named preset (%(presets)s) or a TOML file; default: gpu where torch sees a CUDA "
                               "device, else cpu"), presets=PRESETS)
    sp.add_argument("--seeds", type=_seeds, default=None, metavar="SEEDS",
                    help="train the recipe once per seed (a count N, a list 3,7 or a range 6-10): seed 1 in DIR/run, "
                         "seed S in DIR/run-seed-S; the TTA table and the report cover them all. Default: one run "
                         "(DIR/run), and the demo says what one seed cannot tell")
    sp.add_argument("--parallel", type=int, default=1, metavar="K",
                    help="with --seeds: K seeds at once, one GPU each (or the CPUs shared), as train --parallel")
    sp.add_argument("--no-sweep", action="store_true",
                    help="skip the beam sweep on dev-clean after training (evaluation time and error rates per beam "
                         "width, Table 3 form): the TTA, the final splits and the report without it")
    _allow_emulated_arg(sp)
    sp.add_argument("overrides", nargs="*", help="key=value overrides of the preset")


def cmd_demo(a) -> int:
    from speechperf.drive.demo import run_demo, summary  # torch: this command's only

    _isa_cap(a)

    rows = run_demo(Path(a.out), hours=a.hours, minutes=a.minutes, preset=a.preset, overrides=a.overrides, quiet=a.json,
                    seeds=a.seeds, parallel=a.parallel, sweep=not a.no_sweep, allow_emulated=a.allow_emulated)
    if a.json:
        emit(rows, True)
    elif a.wide:
        error_column(rows)
        emit(rows, False, width=None, columns=[
            "run", "workload", "metric", "target", "median of", "epochs to target", "minutes", "shared", "relative",
            "error at TTA [95%]", "init s", "TFLOPS", "MFU %", "cost to accuracy $", "energy to accuracy kWh",
            "time parts", "price note"])
        notes(rows, "MFU note")
        notes(rows, "shared note")
    else:  # a few columns, then what was timed and where it went in five lines (demo.summary)
        short = tta_text.short_rows(rows)
        emit(short, False, columns=tta_text.columns(short), width=WIDTH)
        print_lines(["", *summary(rows, Path(a.out) / "report" / "index.html")])
    return 0


GROUPS = {"parallel": "parallel training algorithms"}
COMMANDS = [
    Command("train", "train an acoustic model and log time-to-accuracy", cmd_train, _train_args, epilog=TRAIN_KEYS),
    Command("sweep", "train runs per algorithm and worker count: speedup, WER/CER, TTA, communication, MFU",
            cmd_parallel_sweep, None, group="parallel", parents=_sweep_parents),
    Command("reproduce", "train a reference seed's first epochs under the ISA cap at 1 thread and compare them with "
            "the reference curve bit for bit (exit 0 identical, 1 differs, 3 cannot be compared)", cmd_reproduce,
            _reproduce_args),
    Command("demo", "synth -> prepare -> train (gpu preset with CUDA, else cpu) -> TTA table", cmd_demo, _demo_args),
]
