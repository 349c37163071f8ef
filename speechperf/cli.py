"""Command line: parses arguments and calls one library function per command.

Every command that prints a table takes ``--json`` and then prints the same rows as JSON.
Errors that the user can fix (bad input, bad config) print one line naming the file or
value and exit with status 2; anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

from speechperf.decode import WORDBEAM_MODES
from speechperf.errors import SpeechperfError
from speechperf import metric
from speechperf.tables import emit, emit_json


class Registry:
    """The names in a registry, read when argparse first checks or shows them (importing a
    registry can take seconds: torch, numba), so that ``--help`` lists them as choices."""

    def __init__(self, load):
        self.load, self.names = load, None

    def _get(self) -> list[str]:
        if self.names is None:
            self.names = sorted(self.load())
        return self.names

    def __contains__(self, name) -> bool:
        return name in self._get()

    def __iter__(self):
        return iter(self._get())


def _decoders():
    from speechperf.decode import DECODERS

    return DECODERS.names()


def _zoo_models():
    from speechperf.bench.zoo import ZOO

    return ZOO


def _dtypes():
    from speechperf.bench.ops import DTYPES

    return DTYPES


def _presets():
    from speechperf.config import preset_names

    return preset_names()


DECODER_NAMES, ZOO_MODELS, DTYPE_NAMES, PRESETS = (Registry(_decoders), Registry(_zoo_models), Registry(_dtypes),
                                                   Registry(_presets))
ZOO_PRECISIONS = ("fp32", "amp")


def _csv(kind=str, choices=None):
    """A comma-separated list; with ``choices``, every item must be one of them."""
    def parse(s):
        items = [kind(x) for x in s.split(",") if x.strip()]
        bad = [x for x in items if choices is not None and x not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"{', '.join(map(str, bad))} not among: {', '.join(map(str, choices))}")
        return items
    return parse


def _targets(text: str):
    """A target set (paper, algoperf) or comma-separated error rates, each finite and in (0, 100]."""
    from speechperf.scoring.targets import TargetError, parse_targets

    try:
        return parse_targets(text).name or text  # numbers are bound to --metric by the library
    except TargetError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _preset(name: str) -> str:
    """A preset name or a TOML file."""
    if name.endswith(".toml") or name in PRESETS:
        return name
    raise argparse.ArgumentTypeError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)} (or a .toml file)")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults shown for every option, documented or not."""

    def _format_action(self, action):
        if not action.help and action.option_strings and self._shows_default(action):
            action = copy.copy(action)  # argparse prints nothing for an option without help
            action.help = "(default: %(default)s)"
        return super()._format_action(action)

    def _split_lines(self, text, width):
        # names such as conformer-cpu stay whole (argparse's wrap breaks lines at hyphens)
        import textwrap

        return textwrap.wrap(self._whitespace_matcher.sub(" ", text).strip(), width, break_on_hyphens=False)

    def _get_help_string(self, action):
        text = action.help or ""
        if "%(default)" not in text and action.option_strings and self._shows_default(action):
            text = f"{text.strip()} (default: %(default)s)".strip()
        return text

    @staticmethod
    def _shows_default(action) -> bool:
        return not (action.default is None or action.default is False or action.default is argparse.SUPPRESS)


def cmd_corpus_synth(a) -> int:
    from speechperf.corpus.synth import synthesize

    summary = synthesize(Path(a.out), hours=a.hours, seed=a.seed, progress=not a.json)
    emit(summary["splits"], a.json)
    return 0


def cmd_corpus_check(a) -> int:
    from speechperf.corpus.librispeech import check_corpus

    rows = check_corpus(Path(a.corpus), splits=a.splits)
    emit(rows, a.json)
    return 0


def cmd_corpus_fetch(a) -> int:
    from speechperf.corpus.fetch import fetch_corpus

    rows = fetch_corpus(a.corpus, Path(a.out), parts=a.parts, mirror=a.mirror, keep_archives=a.keep_archives,
                        timeout=a.timeout, progress=not a.json)
    emit(rows, a.json)
    return 0


def cmd_prepare(a) -> int:
    from speechperf.features.feature_config import FeatureConfig
    from speechperf.features.prepare import prepare

    summary = prepare(Path(a.corpus), Path(a.out), splits=a.splits, workers=a.workers, progress=not a.json,
                      recompute_stats=a.recompute_stats, config=FeatureConfig(compress=not a.raw))
    emit(summary["splits"], a.json)
    return 0


def _seeds(text: str):
    """--seeds: a count N (seeds 1..N), a list 3,7 or a range 6-10 (studies/seeds.py)."""
    from speechperf.studies.seeds import parse_seeds

    try:
        return parse_seeds(text)
    except SpeechperfError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _isa_cap(a) -> None:
    """--isa: this command again, the process replaced by one under the whole cap (telemetry/isa_cap.py)."""
    from speechperf.telemetry.isa_cap import exec_capped

    exec_capped(a.isa, sys.argv[1:])


def cmd_train(a) -> int:
    from speechperf.studies.study import run_check
    from speechperf.train.loop import RESUME_MODES, TrainRequest, train

    _isa_cap(a)
    request = TrainRequest(preset=a.preset, data=a.data or None, out=a.out or None, overrides=a.overrides,
                           resume=a.resume, db_path=a.db or None, quiet=a.json, platform=a.platform, label=a.label,
                           label_suffix=a.label_suffix, check=run_check)
    if a.seeds is not None:
        return _train_seeds(a, request, RESUME_MODES)
    if a.parallel != 1:
        raise SpeechperfError(f"--parallel {a.parallel} without --seeds: it places seeds side by side; one run "
                              "trains with all the devices it is given (torchrun for several)")
    result = train(request)
    from speechperf.train.distributed import DistEnv

    # every rank of a torchrun job returns rank 0's summary (one exit status); one prints it
    if DistEnv.from_env().rank == 0:
        emit([result], a.json)
    return 0 if result.get("status") in ("success", "time_cap", "max_epochs") else 1


def _train_seeds(a, request, resume_modes) -> int:
    """``train --seeds``: one run folder per seed under --out; a seed that fails stops the
    command (train_seeds raises: exit 1 naming the seed's folder)."""
    from speechperf.train.distributed import DistEnv
    from speechperf.studies.seeds import train_seeds

    if a.resume not in resume_modes:
        raise SpeechperfError(f"--resume {a.resume} with --seeds: --resume takes {', '.join(resume_modes)} there "
                              "(each seed's folder is continued as the same command continues one run)")
    env = DistEnv.from_env()
    rank0 = env.rank == 0
    say = print if rank0 and not a.json else None
    say_seeds = (lambda msg: say(f"[seeds] {msg}", flush=True)) if say else None
    if a.parallel > 1:
        from speechperf.studies.seed_slots import train_seeds_parallel

        if env.world > 1:
            raise SpeechperfError("--parallel places one seed per device itself: run it without torchrun")
        results = train_seeds_parallel(a.seeds, a.parallel, request, say=say_seeds)
    else:
        results = train_seeds(a.seeds, request, say=say_seeds)
    if rank0:  # the text table: what tells the seeds apart; --json: every summary in full
        emit(results, a.json, columns=None if a.json else ["seed", "run", "status", "epochs", "iterations", "clock_min",
                                                             *(f"last_{m}" for m in metric.targets())])
    return 0


def cmd_tta(a) -> int:
    from speechperf.studies.study import study_notes, tta_study

    study = tta_study([Path(r) for r in a.runs], metric=a.metric, targets=a.targets, epochs=a.epochs,
                      price_per_hour=a.price_per_hour, platform_file=a.platform_file)
    if a.json:
        emit_json(study)
        return 0
    _error_column(study["runs"])
    emit(study["runs"], False, columns=["run", "workload", "machine", "metric", "target", "epochs", "minutes", "relative",
                                        "error at TTA [95%]", "epochs to target", "min/epoch", "RCP check", "init s", "TFLOPS", "MFU %",
                                        "platform", "cost to accuracy $", "TTA x price ($ min)", "energy to accuracy kWh", "time parts",
                                        "price note"])
    print("\nSeeds per group (workload, configuration apart from train.seed, machine):")
    emit(study["groups"], False, columns=["group", "target", "runs", "reached", "never reached", "unfinished",
                                          "median TTA min", "olympic TTA min", "min TTA min", "max TTA min",
                                          "median epochs to target", "median min/epoch", "min/epoch max/min",
                                          "epochs to target per seed", "RCP check", "olympic rule"])
    if study["comparisons"]:
        print("\nBetween groups of one workload:")
        emit(study["comparisons"], False, columns=["A", "B", "target", "seeds A", "seeds B", "TTA ratio A/B", "95% low",
                                                   "95% high", "epochs ratio A/B", "min/epoch ratio A/B", "verdict"])
    for line in study_notes(study):
        print(line)
    return 0


def _error_column(rows: list[dict]) -> None:
    """The text tables' one column for the error where the target was declared and its 95%
    interval (``9.36 [8.10, 10.70]``; --json keeps the three numbers)."""
    from speechperf.scoring.bootstrap import with_interval

    for row in rows:
        row["error at TTA [95%]"] = with_interval(row["error at TTA"], row["error 95% low"], row["error 95% high"])


def cmd_check_log(a) -> int:
    from speechperf.train.mlperf import check_run

    row = check_run(Path(a.run))
    emit([row], a.json)
    return 0 if row["compliant"] else 1


def cmd_eval(a) -> int:
    from speechperf.train.evaluate import evaluate_run

    row = evaluate_run(Path(a.run), split=a.split, decoder=a.decoder, beam=a.beam, workers=a.workers,
                       mode=a.mode, data=Path(a.data) if a.data else None)
    emit([row], a.json)
    return 0


def cmd_beam_sweep(a) -> int:
    from speechperf.train.evaluate import beam_sweep

    rows = beam_sweep(Path(a.run), widths=a.widths, split=a.split, decoder=a.decoder, workers=a.workers,
                      mode=a.mode, data=Path(a.data) if a.data else None, db_path=Path(a.db) if a.db else None)
    emit(rows, a.json)
    return 0


def cmd_lm_build(a) -> int:
    from speechperf.decode.lm import build_lm_for_features

    emit([build_lm_for_features(Path(a.features), split=a.split)], a.json)
    return 0


def cmd_report(a) -> int:
    from speechperf.studies.report.html import build_report

    path = build_report([Path(r) for r in a.runs], Path(a.out), db_path=Path(a.db) if a.db else None,
                        price_per_hour=a.price_per_hour, platform_file=a.platform_file, targets=a.targets,
                        metric=a.metric)
    print(path)
    return 0


def cmd_platforms(a) -> int:
    from speechperf.telemetry.platforms import profile_table

    emit(profile_table(a.file), a.json, columns=None if a.json else
         ["profile", "matches", "per", "$/hour", "hourly date", "purchase $", "price date"])
    if not a.json:
        print("Sources of every price: speechperf platforms --json")
    return 0


def cmd_bench_ops(a) -> int:
    from speechperf.bench.ops import COLUMNS, notes, run_ops
    from speechperf.bench.outcome import check_measured

    rows = run_ops(device=a.device, dtypes=a.dtype, threads=a.threads, iters=a.iters, db_path=a.db, quick=a.quick,
                   seconds=a.seconds, csv_path=a.csv, warmup_seconds=a.warmup_seconds, repeats=a.repeats,
                   energy_min_seconds=a.energy_min_seconds)
    emit(rows, a.json, columns=COLUMNS)
    if not a.json:
        print("\n".join(notes(rows)))
    check_measured(rows, "bench ops")  # nothing measured: exit 1, the causes in words
    return 0


def cmd_bench_zoo(a) -> int:
    from speechperf.bench.outcome import check_measured
    from speechperf.bench.zoo import COLUMNS, notes, run_zoo

    rows = run_zoo(models=a.models, batches=a.batch, precisions=a.precision, device=a.device, iters=a.iters,
                   db_path=a.db, csv_path=a.csv, warmup=a.warmup, seconds=a.seconds, warmup_seconds=a.warmup_seconds,
                   repeats=a.repeats, energy_min_seconds=a.energy_min_seconds)
    emit(rows, a.json, columns=COLUMNS)
    if not a.json:
        print("\n".join(notes(rows)))
    check_measured(rows, "bench zoo")  # nothing measured: exit 1, the causes in words
    return 0


def cmd_bench_feed(a) -> int:
    from speechperf.train.feed import COLUMNS, notes, run_feed

    row = run_feed(a.preset, a.overrides, data=Path(a.data) if a.data else None, device=a.device, profile=a.profile,
                   readers=a.readers, windows=a.windows, steps=a.steps, warmup=a.warmup, batches=a.batches,
                   cores=a.cores)
    emit([row], a.json, columns=COLUMNS)
    if not a.json:
        print("\n".join(notes(row)))
    return 0


def _timing_args(sp, what: str) -> None:
    """The measurement method's options (speechperf/bench/timing.py; defaults per device there)."""
    sp.add_argument("--seconds", "--cpu-seconds", type=float, default=None,
                    help=f"timed seconds per {what} without --iters (default: per device, docs/bench.md)")
    sp.add_argument("--warmup-seconds", type=float, default=None, help="warm-up budget when the step time is not yet stable")
    sp.add_argument("--repeats", type=int, default=None, help="consecutive windows the timed steps are split into (default 3)")
    sp.add_argument("--energy-min-seconds", type=float, default=None,
                    help="shortest window given power and energy (default 2; shorter: none, with the reason)")


def _targets_args(sp) -> None:
    sp.add_argument("--targets", type=_targets, default="paper",
                    help="TTA targets: paper (the DS2 paper's CER 10/8/7, WER 22/20.2/19.2, as thresholds on the "
                         "run's own corpus), algoperf (AlgoPerf's validation WER for runs of AlgoPerf's workload, "
                         "which speechperf has none of yet: refused for its runs), or error rates %% of --metric, "
                         "e.g. 10,8")


def cmd_parallel_sweep(a) -> int:
    from speechperf.studies.sweep import run_sweep

    rows = run_sweep(a.rest, as_json=a.json)
    emit(rows, a.json)
    return 0


def cmd_demo(a) -> int:
    from speechperf.demo import run_demo

    _isa_cap(a)

    rows = run_demo(Path(a.out), hours=a.hours, minutes=a.minutes, preset=a.preset, overrides=a.overrides, quiet=a.json,
                    seeds=a.seeds, parallel=a.parallel)
    if not a.json:
        _error_column(rows)
    emit(rows, a.json, columns=["run", "workload", "metric", "target", "epochs", "minutes", "relative",
                                *([] if a.json else ["error at TTA [95%]"]), "init s",
                                "TFLOPS", "MFU %", "cost to accuracy $", "energy to accuracy kWh", "time parts",
                                "price note"])
    return 0


def cmd_reproduce(a) -> int:
    from speechperf.studies.reproduce import EXIT, reproduce

    result = reproduce(a.preset, Path(a.data), seed=a.seed, epochs=a.epochs, out=Path(a.out) if a.out else None,
                       quiet=a.json, corpus=Path(a.prepare) if a.prepare else None)
    if a.json:
        emit_json(result)
    else:
        if result["epochs"]:
            emit(result["epochs"], False)
        print(f"{a.preset} seed {result['seed']}: {result['text']}")
    return EXIT[result["verdict"]]


def _isa_arg(sp) -> None:
    from speechperf.telemetry.isa_cap import CAPS

    sp.add_argument("--isa", choices=sorted(CAPS), default=None,
                    help="cap the instruction set of oneDNN and of torch's own kernels and fix MKL's code path "
                         "(ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY and MKL_CBWR=COMPATIBLE; the command restarts "
                         "itself under them): with train.threads=1, a "
                         "reference seed's curve is reproducible bit for bit (docs/reproduce.md)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="speechperf", description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def add(name, func, help, parent=sub, parents=()):
        sp = parent.add_parser(name, help=help, description=help, formatter_class=HelpFormatter, parents=list(parents))
        sp.add_argument("--json", action="store_true", help="print the rows as JSON")
        sp.set_defaults(func=func)
        return sp

    corpus = sub.add_parser("corpus", help="corpora: synthesize the embedded one, fetch LibriSpeech, check one")
    corpus = corpus.add_subparsers(dest="sub", required=True)
    sp = add("synth", cmd_corpus_synth, "synthesize the embedded English corpus in LibriSpeech layout", corpus)
    sp.add_argument("out")
    sp.add_argument("--hours", type=float, default=1.5, help="hours of training audio")
    sp.add_argument("--seed", type=int, default=1)
    sp = add("fetch", cmd_corpus_fetch, "download and unpack LibriSpeech (OpenSLR 12) or Mini LibriSpeech (OpenSLR "
             "31), resumable, every archive verified against the published size and checksums", corpus)
    sp.add_argument("corpus", choices=["librispeech", "mini-librispeech"])
    sp.add_argument("out", help="corpus folder: OUT/SPLIT/SPEAKER/CHAPTER/*.flac, for speechperf prepare OUT FEATS")
    sp.add_argument("--parts", type=_csv(), default=None,
                    help="parts (splits) to fetch, e.g. dev-clean,train-clean-100 (default: all of the corpus)")
    sp.add_argument("--mirror", default=None, metavar="URL",
                    help="replaces the base address https://www.openslr.org/resources, "
                         "e.g. --mirror https://us.openslr.org/resources")
    sp.add_argument("--keep-archives", action="store_true", help="keep OUT/.fetch/PART.tar.gz after extraction")
    sp.add_argument("--timeout", type=float, default=60.0, help="seconds without data before a download fails")
    sp = add("check", cmd_corpus_check, "scan a LibriSpeech-layout corpus and report problems", corpus)
    sp.add_argument("corpus")
    sp.add_argument("--splits", type=_csv(), default=None)

    sp = add("prepare", cmd_prepare, "extract 93-dim features into compressed shards")
    sp.add_argument("corpus")
    sp.add_argument("out")
    sp.add_argument("--splits", type=_csv(), default=None, help="splits to prepare (default: all found)")
    sp.add_argument("--workers", type=int, default=0, help="CPU worker processes (0: one per core)")
    sp.add_argument("--raw", action="store_true",
                    help="store the shards' arrays uncompressed: 1.2x the disk, about half a loader reader's CPU "
                         "(for GPU hosts whose readers cannot keep up; a folder keeps the form it was made with)")
    sp.add_argument("--recompute-stats", action="store_true",
                    help="compute stats.json again over every prepared train-* split (needed to add a training "
                         "split; runs trained on the previous statistics then refuse to continue); without it "
                         "stats.json is never changed")

    sp = add("train", cmd_train, "train an acoustic model and log time-to-accuracy")
    _isa_arg(sp)
    sp.add_argument("--preset", default="cpu", type=_preset, metavar="PRESET",
                    help=f"named preset ({', '.join(PRESETS)}) or a TOML file")
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
                         "(K at most the GPUs visible), else the CPUs shared (train.threads = CPUs // K unless "
                         "given); each seed's output in --out/seed-S.log; a failed seed stops the others, saved")
    sp.add_argument("overrides", nargs="*", help="key=value or section.key=value")

    sp = add("tta", cmd_tta, "time-to-accuracy table (Table 4 form)")
    sp.add_argument("runs", nargs="+")
    sp.add_argument("--metric", choices=metric.targets(), default=metric.DEFAULT_TARGET, help="validation error the targets apply to")
    _targets_args(sp)
    sp.add_argument("--epochs", type=int, default=3, help="median over this many last epochs")
    sp.add_argument("--price-per-hour", type=float, default=None,
                    help="$/hour of the whole machine of every run given (overrides every profile)")
    sp.add_argument("--platform-file", default=None,
                    help="a platform profile TOML whose prices apply to every run given (overrides the recorded one)")

    sp = add("eval", cmd_eval, "evaluate a run's checkpoint on a split")
    sp.add_argument("run")
    sp.add_argument("--split", default="dev-clean", help="prepared split to evaluate")
    sp.add_argument("--decoder", default="wordbeam", choices=DECODER_NAMES, help="CTC decoder")
    sp.add_argument("--mode", default="ngrams", choices=WORDBEAM_MODES, help="word beam search mode (wordbeam only)")
    sp.add_argument("--beam", type=int, default=256, help="beam width")
    sp.add_argument("--workers", type=int, default=0, help="decoding threads (0: one per CPU this process may use, less the loader's readers)")
    sp.add_argument("--data", help="features folder (default: the one the run recorded, where it exists)")

    sp = add("beam-sweep", cmd_beam_sweep, "evaluation time, WER and CER per beam width (Table 3 form)")
    sp.add_argument("run")
    sp.add_argument("--widths", type=_csv(int), default=[64, 128, 256, 512, 1024, 2048, 4096], help="beam widths")
    sp.add_argument("--split", default="dev-clean", help="prepared split to evaluate")
    sp.add_argument("--decoder", default="wordbeam", choices=DECODER_NAMES, help="CTC decoder")
    sp.add_argument("--mode", default="ngrams", choices=WORDBEAM_MODES, help="word beam search mode (wordbeam only)")
    sp.add_argument("--workers", type=int, default=0, help="decoding threads (0: one per CPU this process may use, less the loader's readers)")
    sp.add_argument("--data", help="features folder (default: the one the run recorded, where it exists)")
    sp.add_argument("--db", help="a shared results database that also receives the rows")

    lm = sub.add_parser("lm", help="dictionary and language model").add_subparsers(dest="sub", required=True)
    sp = add("build", cmd_lm_build, "build the dictionary and bigram LM of a prepared dataset", lm)
    sp.add_argument("features")
    sp.add_argument("--split", default=None, help="training split(s) whose text is used (default: all train-*)")

    sp = add("check-log", cmd_check_log, "check a run's events.log with mlperf-logging's compliance checker "
             "(training rules, speechperf's benchmark rules); exit 1 if it does not comply")
    sp.add_argument("run", help="run folder or events.log")

    sp = add("report", cmd_report, "HTML report comparing runs")
    sp.add_argument("runs", nargs="+", help="run folders, from any machines")
    sp.add_argument("--out", required=True, help="report folder")
    sp.add_argument("--db", help="shared database for the benchmark and parallel sections (default: the first "
                                 "run's)")
    sp.add_argument("--price-per-hour", type=float, default=None,
                    help="$/hour of the whole machine of every run given (overrides every profile)")
    sp.add_argument("--platform-file", default=None,
                    help="a platform profile TOML whose prices apply to every run given (overrides the recorded one)")

    sp.add_argument("--metric", choices=metric.targets(), default=metric.DEFAULT_TARGET,
                    help="the metric of explicit --targets numbers")
    _targets_args(sp)

    sp = add("platforms", cmd_platforms, "platform profiles: what each matches, prices with their date and source")
    sp.add_argument("--file", action="append", default=[], help="also a user profile TOML (repeatable)")

    bench = sub.add_parser("bench", help="accelerator characterization").add_subparsers(dest="sub", required=True)
    sp = add("ops", cmd_bench_ops, "operator FLOPS against peak", bench)
    sp.add_argument("--device", default="cpu")
    sp.add_argument("--dtype", type=_csv(choices=DTYPE_NAMES), default=["fp32"],
                    help=f"data types, comma separated ({', '.join(DTYPE_NAMES)})")
    sp.add_argument("--threads", type=_csv(int), default=None)
    sp.add_argument("--iters", type=int, default=None)
    sp.add_argument("--quick", action="store_true", help="small shapes only (smoke test)")
    _timing_args(sp, "op")
    sp.add_argument("--csv", help="also write the rows to this CSV file")
    sp.add_argument("--db")
    sp = add("zoo", cmd_bench_zoo, "model-zoo training throughput, power and energy", bench)
    sp.add_argument("--models", type=_csv(choices=ZOO_MODELS), default=None,
                    help=f"models, comma separated ({', '.join(ZOO_MODELS)}; default: all)")
    sp.add_argument("--batch", type=_csv(int), default=None, help="batch sizes, comma separated (default: per model)")
    sp.add_argument("--precision", type=_csv(choices=ZOO_PRECISIONS), default=["fp32"],
                    help=f"precisions, comma separated ({', '.join(ZOO_PRECISIONS)})")
    sp.add_argument("--device", default="cpu")
    sp.add_argument("--iters", type=int, default=None)
    sp.add_argument("--warmup", type=int, default=None, help="untimed steps at least (default: 3 on a GPU, 1 on a CPU)")
    _timing_args(sp, "row")
    sp.add_argument("--csv", help="Table 8 layout CSV (default: bench_zoo_table8.csv beside --db)")
    sp.add_argument("--db")

    sp = add("feed", cmd_bench_feed, "how many CPU cores feed one GPU: the preset's training step's appetite (audio "
             "s/s on batches on the device, LibriSpeech lengths) against the loader's supply per reader", bench)
    sp.add_argument("--preset", default="gpu", type=_preset, metavar="PRESET", help="named preset or a TOML file")
    sp.add_argument("--data", default=None, help="prepared features to read (default: a synthetic shard set at "
                    "LibriSpeech lengths in a temporary folder)")
    sp.add_argument("--device", default="auto", help="where the appetite is measured: auto (a GPU when torch sees "
                    "one, else the recorded profile's figure), cuda, cuda:N or cpu")
    sp.add_argument("--profile", default=None, help="recorded GPU profile (speechperf/config/gpu_appetite.toml; "
                    "default: its first) when no GPU measures the appetite")
    sp.add_argument("--readers", type=int, default=1, help="reader processes timed together (the supply is per reader)")
    sp.add_argument("--windows", type=int, default=3, help="timed windows of each measurement (median and spread)")
    sp.add_argument("--steps", type=int, default=5, help="training steps per appetite window")
    sp.add_argument("--warmup", type=int, default=3, help="untimed training steps first")
    sp.add_argument("--batches", type=int, default=4, help="loader batches per supply window")
    sp.add_argument("--cores", type=int, default=None, help="the host's cores (default: os.cpu_count())")
    sp.add_argument("overrides", nargs="*", help="key=value overrides of the preset (e.g. loader.batch_size=64)")

    par = sub.add_parser("parallel", help="parallel training algorithms").add_subparsers(dest="sub", required=True)
    from speechperf.studies import sweep

    add("sweep", cmd_parallel_sweep, "train runs per algorithm and worker count: speedup, WER/CER, TTA, "
        "communication, MFU", par,
        parents=[sweep.parser(add_help=False)])

    sp = add("reproduce", cmd_reproduce, "train a reference seed's first epochs under the ISA cap at 1 thread and "
             "compare them with the reference curve bit for bit (exit 0 identical, 1 differs, 3 cannot be compared)")
    sp.add_argument("preset", help="a preset with reference curves (speechperf/config/rcp/PRESET.json)")
    sp.add_argument("--data", required=True, help="prepared features (the reference's corpus: see docs/reproduce.md)")
    sp.add_argument("--seed", type=int, default=None, help="reference seed (default: the first with a curve)")
    sp.add_argument("--epochs", type=int, default=2, help="epochs to train and compare")
    sp.add_argument("--out", default=None, help="keep the run in this new folder (default: a temporary one)")
    sp.add_argument("--prepare", default=None, metavar="CORPUS",
                    help="where --data is not the features of any reference curve, prepare CORPUS into DATA-reproduce "
                         "and reproduce on that")

    sp = add("demo", cmd_demo, "synth -> prepare -> train (gpu preset with CUDA, else cpu) -> TTA table")
    _isa_arg(sp)
    sp.add_argument("--out", default="demo")
    sp.add_argument("--hours", type=float, default=None, help="hours of training audio (default: the preset's)")
    sp.add_argument("--minutes", type=float, default=None, help="training time cap (default: the preset's)")
    sp.add_argument("--preset", default=None, type=_preset, metavar="PRESET",
                    help=f"named preset ({', '.join(PRESETS)}) or a TOML file; default: gpu where torch sees a CUDA "
                         "device, else cpu")
    sp.add_argument("--seeds", type=_seeds, default=None, metavar="SEEDS",
                    help="train the recipe once per seed (a count N, a list 3,7 or a range 6-10): seed 1 in DIR/run, "
                         "seed S in DIR/run-seed-S; the TTA table and the report cover them all. Default: one run "
                         "(DIR/run), and the demo says what one seed cannot tell")
    sp.add_argument("--parallel", type=int, default=1, metavar="K",
                    help="with --seeds: K seeds at once, one GPU each (or the CPUs shared), as train --parallel")
    sp.add_argument("overrides", nargs="*", help="key=value overrides of the preset")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)  # the sweep's options are checked (and shown) here
    if args.command == "parallel":  # and passed on as given to the sweep's own parser
        args.rest = [x for x in argv[argv.index(args.sub) + 1:] if x != "--json"]
    try:
        return args.func(args)
    except SpeechperfError as e:  # 2: bad input; 1: a run that failed (RunFailed)
        # notes say where a multi-run command stopped (train --seeds): on the error's line
        print(f"speechperf: error: {'; '.join([str(e), *getattr(e, '__notes__', [])])}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("speechperf: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
