"""Commands that read run folders: ``tta``, ``eval``, ``beam-sweep``, ``check-log``, ``report``,
``export``, ``platforms`` (the prices they apply) and ``cost`` (a training run's, from a measured
throughput); each one's arguments declared right above it."""
from __future__ import annotations

import argparse
from pathlib import Path

from speechperf import metric
from speechperf.cli.parsing import WIDTH, Command, Registry, csv_list, trust_model_arg, trust_models, width
from speechperf.decode import DECODERS, WORDBEAM_MODES
from speechperf.scoring.bootstrap import with_interval
from speechperf.scoring.targets import TargetError, parse_targets
from speechperf.studies import tta_text
from speechperf.tables import emit, emit_json, notes, print_lines


def _decoders():
    return DECODERS.names()  # the registry read (numba) when --help shows the names


DECODER_NAMES = Registry(_decoders)


def _targets(text: str):
    """A target set (paper, algoperf) or comma-separated error rates, each finite and in (0, 100]."""
    try:
        return parse_targets(text).name or text  # numbers are bound to --metric by the library
    except TargetError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _targets_args(sp) -> None:
    sp.add_argument("--targets", type=_targets, default="paper",
                    help="TTA targets: paper (the DS2 paper's CER 10/8/7, WER 22/20.2/19.2, as thresholds on the "
                         "run's own corpus), algoperf (AlgoPerf's validation WER for runs of AlgoPerf's workload, "
                         "which speechperf has none of yet: refused for its runs), or error rates %% of --metric, "
                         "e.g. 10,8")


def _prices_args(sp) -> None:
    sp.add_argument("--price-per-hour", type=float, default=None,
                    help="$/hour of the whole machine of every run given (overrides every profile)")
    sp.add_argument("--platform-file", default=None,
                    help="a platform profile TOML whose prices apply to every run given (overrides the recorded one)")


def _tta_args(sp) -> None:
    sp.add_argument("runs", nargs="+")
    sp.add_argument("--metric", choices=metric.targets(), default=metric.DEFAULT_TARGET,
                    help="validation error the targets apply to")
    _targets_args(sp)
    sp.add_argument("--epochs", type=int, default=3, help="median over this many last epochs")
    _prices_args(sp)


def cmd_tta(a) -> int:
    from speechperf.studies.study import tta_study  # torch: the commands that read runs

    study = tta_study([Path(r) for r in a.runs], metric=a.metric, targets=a.targets, epochs=a.epochs,
                      price_per_hour=a.price_per_hour, platform_file=a.platform_file)
    if a.json:
        emit_json(study)
    elif a.wide:
        _tta_wide(study)
    else:
        _tta_narrow(study)
    return 0


def _tta_narrow(study: dict) -> None:
    """The default text: a few columns a run (studies/tta_text.py), the groups only where one
    holds several seeds, notes of one line each; everything fits 100 columns."""
    short = tta_text.short_rows(study["runs"])
    emit(short, False, columns=tta_text.columns(short), width=WIDTH)
    if tta_text.several_seeds(study["groups"]):
        print("\nSeeds per group (workload, configuration apart from train.seed, machine):")
        emit(tta_text.short_groups(study["groups"]), False, columns=tta_text.GROUP_COLUMNS, width=WIDTH)
    if study["comparisons"]:
        print("\nBetween groups of one workload:")
        emit(tta_text.short_comparisons(study["comparisons"]), False, columns=tta_text.COMPARISON_COLUMNS, width=WIDTH)
    print_lines(tta_text.short_notes(study))


def _tta_wide(study: dict) -> None:
    """``--wide``: every column of every table, and every note whole."""
    from speechperf.studies.study import study_notes  # torch: the commands that read runs

    error_column(study["runs"])
    emit(study["runs"], False, width=None, columns=[
        "run", "workload", "machine", "metric", "target", "median of", "minutes", "shared", "relative",
        "error at TTA [95%]", "epochs to target", "min/epoch", "RCP check", "init s", "TFLOPS", "MFU %", "platform",
        "cost to accuracy $", "TTA x price ($ min)", "energy to accuracy kWh", "time parts", "price note"])
    notes(study["runs"], "MFU note")
    notes(study["runs"], "shared note")
    print("\nSeeds per group (workload, configuration apart from train.seed, machine):")
    emit(study["groups"], False, width=None, columns=[
        "group", "target", "runs", "reached", "never reached", "unfinished", "median TTA min", "olympic TTA min",
        "min TTA min", "max TTA min", "median epochs to target", "median min/epoch", "min/epoch max/min",
        "epochs to target per seed", "RCP check", "olympic rule"])
    if study["comparisons"]:
        print("\nBetween groups of one workload:")
        emit(study["comparisons"], False, width=None, columns=[
            "A", "B", "target", "seeds A", "seeds B", "TTA ratio A/B", "95% low", "95% high", "epochs ratio A/B",
            "min/epoch ratio A/B", "verdict"])
    print_lines(study_notes(study), width=None)


def error_column(rows: list[dict]) -> None:
    """The text tables' one column for the error where the target was declared and its 95%
    interval (``9.36 [8.10, 10.70]``; --json keeps the three numbers)."""
    for row in rows:
        row["error at TTA [95%]"] = with_interval(row["error at TTA"], row["error 95% low"], row["error 95% high"])


def _check_log_args(sp) -> None:
    sp.add_argument("run", help="run folder or events.log")


def cmd_check_log(a) -> int:
    from speechperf.results.mlperf import check_run  # mlperf-logging, yaml: this command's only

    row = check_run(Path(a.run))
    emit([row], a.json, width=width(a))
    return 0 if row["compliant"] else 1


def _decoding_args(sp) -> None:
    """The decoder's options, eval's and beam-sweep's."""
    # a metavar: argparse lists choices while it builds a parser, and the decoders' names import numba
    sp.add_argument("--decoder", default="wordbeam", choices=DECODER_NAMES, metavar="DECODER",
                    help="CTC decoder: %(choices)s")
    sp.add_argument("--mode", default="ngrams", choices=WORDBEAM_MODES, help="word beam search mode (wordbeam only)")


def _eval_args(sp) -> None:
    sp.add_argument("run")
    sp.add_argument("--split", default="dev-clean", help="prepared split to evaluate")
    _decoding_args(sp)
    sp.add_argument("--beam", type=int, default=256, help="beam width")
    sp.add_argument("--workers", type=int, default=0,
                    help="decoding threads (0: one per CPU this process may use, less the loader's readers, "
                         "at least half of them)")
    sp.add_argument("--data", help="features folder (default: the one the run recorded, where it exists)")
    trust_model_arg(sp)


def cmd_eval(a) -> int:
    from speechperf.studies.evaluate_run import evaluate_run  # torch: this command's only

    trust_models(a)

    row = evaluate_run(Path(a.run), split=a.split, decoder=a.decoder, beam=a.beam, workers=a.workers,
                       mode=a.mode, data=Path(a.data) if a.data else None)
    emit([row], a.json, width=width(a))
    return 0


def _beam_sweep_args(sp) -> None:
    sp.add_argument("run")
    sp.add_argument("--widths", type=csv_list(int), default=[64, 128, 256, 512, 1024, 2048, 4096], help="beam widths")
    sp.add_argument("--split", default="dev-clean", help="prepared split to evaluate")
    _decoding_args(sp)
    sp.add_argument("--workers", type=int, default=0,
                    help="decoding threads (0: one per CPU this process may use, less the loader's readers, "
                         "at least half of them)")
    sp.add_argument("--data", help="features folder (default: the one the run recorded, where it exists)")
    sp.add_argument("--db", help="a shared results database that also receives the rows")
    trust_model_arg(sp)


def cmd_beam_sweep(a) -> int:
    from speechperf.studies.evaluate_run import beam_sweep  # torch: this command's only

    trust_models(a)

    rows = beam_sweep(Path(a.run), widths=a.widths, split=a.split, decoder=a.decoder, workers=a.workers,
                      mode=a.mode, data=Path(a.data) if a.data else None, db_path=Path(a.db) if a.db else None)
    emit(rows, a.json, width=width(a))
    return 0


def _report_args(sp) -> None:
    sp.add_argument("runs", nargs="+", help="run folders, from any machines")
    sp.add_argument("--out", required=True, help="report folder")
    sp.add_argument("--db", help="shared database for the benchmark and parallel sections (default: the first "
                                 "run's)")
    _prices_args(sp)
    sp.add_argument("--metric", choices=metric.targets(), default=metric.DEFAULT_TARGET,
                    help="the metric of explicit --targets numbers")
    _targets_args(sp)
    sp.add_argument("--cost", action="append", default=[], type=Path,
                    help="a `speechperf cost --json` output to draw against device count (repeatable)")


def cmd_report(a) -> int:
    from speechperf.studies.report.html import build_report  # torch, matplotlib: this command's only

    path = build_report([Path(r) for r in a.runs], Path(a.out), db_path=Path(a.db) if a.db else None,
                        price_per_hour=a.price_per_hour, platform_file=a.platform_file, targets=a.targets,
                        metric=a.metric, costs=a.cost)
    print(path)
    return 0


def _export_args(sp) -> None:
    sp.add_argument("runs", nargs="+", help="run folders, finished or still training, from any machines")
    sp.add_argument("--tensorboard", metavar="DIR", help="TensorBoard log folder: each run's events go to DIR/RUN_ID "
                                                           "(an earlier export of the run there is replaced)")
    sp.add_argument("--mlflow", metavar="URI", help="MLflow tracking URI (http://..., file:FOLDER): one MLflow run "
                                                      "per run (an earlier export of the run there is replaced)")
    sp.add_argument("--experiment", default="speechperf", help="MLflow experiment (made where missing)")
    sp.add_argument("--no-report", action="store_true", help="leave the HTML report out of the MLflow run")
    sp.add_argument("--sample-s", type=float, default=1.0,
                    help="telemetry (utilization, power) as the mean of bins of this many seconds of the TTA clock")
    sp.add_argument("--metric", choices=metric.targets(), default=metric.DEFAULT_TARGET,
                    help="validation error the TTA targets apply to")
    _targets_args(sp)
    sp.add_argument("--epochs", type=int, default=3, help="TTA: median over this many last epochs")


def cmd_export(a) -> int:
    from speechperf.studies.export.exporter import export_runs  # torch: this command's only

    rows = export_runs([Path(r) for r in a.runs], tensorboard=Path(a.tensorboard) if a.tensorboard else None,
                       mlflow=a.mlflow, experiment=a.experiment, metric=a.metric, targets=a.targets, epochs=a.epochs,
                       sample_s=a.sample_s, report=not a.no_report)
    emit(rows, a.json, width=width(a))
    return 0


def _platforms_args(sp) -> None:
    sp.add_argument("--file", action="append", default=[], help="also a user profile TOML (repeatable)")


def cmd_platforms(a) -> int:
    from speechperf.hardware.platforms import profile_table  # torch: this command's only

    emit(profile_table(a.file), a.json, width=width(a), columns=None if a.json or a.wide else
         ["profile", "matches", "per", "$/hour", "hourly date", "purchase $", "price date"])
    if not a.json:
        print("Sources of every price: speechperf platforms --json")
    return 0


def _cost_args(sp) -> None:
    sp.add_argument("workload", help="a preset (the at-scale ones: fastconformer-l, fastconformer-xl)")
    sp.add_argument("--hours", type=float, required=True, help="the corpus's hours of audio")
    sp.add_argument("--epochs", type=float, default=None, help="passes over the corpus (or --steps)")
    sp.add_argument("--steps", type=int, default=None, help="training steps of the measured batches (or --epochs)")
    sp.add_argument("--devices", type=int, default=8, help="N: the device count priced beside 1")
    sp.add_argument("--efficiency", type=float, default=None,
                    help="N devices' scaling efficiency where none was measured (default 1.0, said to be an "
                    "assumption)")
    sp.add_argument("--from", dest="source", type=Path, default=None,
                    help="a saved `bench scale --json` output or a one-device run folder, read as data (default: "
                    "measure now with bench scale at its smallest batch)")
    sp.add_argument("--platform", default=None, help="a platform profile (speechperf platforms) or FILE.toml")
    sp.add_argument("--price-per-hour", type=float, default=None, help="dollars per device-hour (wins)")
    sp.add_argument("--device", default="cpu", help="measured now: the device")
    sp.add_argument("--precision", default=None, choices=("fp32", "bf16", "fp16", "fp8"),
                    help="measured now: the precision (default: bench scale's)")
    sp.add_argument("overrides", nargs="*", help="measured now: key=value overrides of the workload's preset")


def cmd_cost(a) -> int:
    from speechperf.studies.cost import COLUMNS, CostRequest, cost, narrow

    got = cost(CostRequest(a.workload, a.hours, a.epochs, a.steps, a.devices, a.efficiency, a.source, a.platform,
                           a.price_per_hour, a.device, a.precision, tuple(a.overrides)))
    if a.json:
        emit_json(got)
        return 0
    emit(got["rows"] if a.wide else narrow(got["rows"]), False, columns=COLUMNS if a.wide else None, width=width(a))
    print_lines(got["assumptions"], width(a))
    return 0


COMMANDS = [
    Command("tta", "time-to-accuracy table (Table 4 form)", cmd_tta, _tta_args),
    Command("eval", "evaluate a run's checkpoint on a split", cmd_eval, _eval_args),
    Command("beam-sweep", "evaluation time, WER and CER per beam width (Table 3 form)", cmd_beam_sweep,
            _beam_sweep_args),
    Command("check-log", "check a run's events.log with mlperf-logging's compliance checker (training rules, "
            "speechperf's benchmark rules); exit 1 if it does not comply", cmd_check_log, _check_log_args),
    Command("report", "HTML report comparing runs", cmd_report, _report_args),
    Command("export", "runs' curves, configuration and TTA into TensorBoard and/or MLflow", cmd_export,
            _export_args),
    Command("platforms", "platform profiles: what each matches, prices with their date and source", cmd_platforms,
            _platforms_args),
    Command("cost", "what training a workload costs: device-hours, kWh and dollars at 1 and N devices, from a "
            "measured throughput with its spread", cmd_cost, _cost_args),
]
