"""The main job: embedded corpus -> features -> train -> TTA table -> report.

The preset is the machine's unless ``--preset`` names one: ``gpu`` (the paper's model in
bf16 on 8 h of audio) where torch sees a CUDA device, ``cpu`` (a small model on 1.5 h)
elsewhere; the demo says which it picked and why. The corpus is synthesized on all cores.

Every stage is cached under the output folder: the corpus and the features are reused
when complete, an interrupted run is resumed, a finished run is reported again as it is
(delete ``DIR/run`` to measure anew).

``--seeds N`` trains the recipe once per seed (drive/seeds.py): seed 1 stays in ``DIR/run``,
where a demo of one seed keeps it (an existing demo folder is its first seed), seed S > 1 in
``DIR/run-seed-S``; the TTA table and the report cover every seed, and the report groups
them (runs that differ only in seed). With one seed the demo says what one seed cannot tell.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from speechperf.config import ConfigError, load_preset
from speechperf.corpus import synth  # synth.synthesize and features_prepare.prepare looked up when called
from speechperf.drive.seed_slots import train_seeds_parallel
from speechperf.drive.seeds import refuse_seed_override, train_seeds
from speechperf.features import prepare as features_prepare
from speechperf.metric import held, metric as metric_of
from speechperf.scoring.bootstrap import with_interval
from speechperf.scoring.targets import PAPER  # the demo's targets: the paper's, of its metrics (cer, wer)
from speechperf.results.layout import has_checkpoint, is_run
from speechperf.results.view import RunView
from speechperf.results.workload import workload, workload_label
from speechperf.studies.evaluate_run import beam_sweep
from speechperf.studies.rcp import epochs_of, load_reference
from speechperf.studies.report.html import build_report
from speechperf.studies.study import run_check, tta_study
from speechperf.studies.time_parts import PARTS, SHORT
from speechperf.studies.tta import tta_table
from speechperf.studies.tta_text import target_text, to_accuracy
from speechperf.tables import fit_line, print_lines
from speechperf.train.loop import train
from speechperf.train.request import TrainRequest

DEFAULT_HOURS = 1.5  # hours of train-clean audio synthesized for the demo (CPU-sized presets: cpu, tiny, conformer-cpu)
# Presets sized for a GPU, whose model needs more audio than the CPU demo's to be busy and to
# generalize; every other preset (a TOML file too) gets DEFAULT_HOURS, and --hours overrides.
PRESET_HOURS = {"gpu": 8.0, "paper": 8.0, "modern": 8.0, "conformer": 8.0, "conformer-algoperf-sizes": 8.0}
SWEEP_WIDTHS = (1, 16, 64, 256)  # Table 3 form on dev-clean: greedy (1) against word beam search


def one_seed(preset: str) -> str:
    """What a one-seed TTA cannot tell, with the spread of the preset's reference seeds where
    it has a reference (config/rcp)."""
    ref, spread = load_reference(preset), ""
    if ref is not None:
        target = ref["targets"][0]
        reached = [e for e in epochs_of(ref, target) if e is not None]
        if reached:
            spread = (f" (the {preset} preset's reference: {min(reached)} to {max(reached)} epochs to "
                      f"{ref['metric'].upper()} {target:g} over {len(ref['seeds'])} seeds)")
    return f"one seed: its TTA mixes machine speed and seed luck{spread}; --seeds 5 tells them apart (as MLPerf)"


def demo_folder(out: Path, seed: int) -> Path:
    """Seed 1 in ``DIR/run`` (where a one-seed demo has always kept its run), seed S in ``DIR/run-seed-S``."""
    return Path(out) / ("run" if seed == 1 else f"run-seed-{seed}")


def pick_preset(cuda: bool | None = None) -> tuple[str, str]:
    """The demo's preset for this machine and why: ``gpu`` with CUDA, else ``cpu``."""
    if cuda is None:
        cuda = torch.cuda.is_available()
    if cuda:
        return "gpu", f"CUDA device {torch.cuda.get_device_name(0)!r} found"
    return "cpu", "no CUDA device"


def run_demo(out: Path, hours: float | None = None, minutes: float | None = None, preset: str | None = None,
             overrides=(), quiet: bool = False, seeds=None, parallel: int = 1, sweep: bool = True,
             allow_emulated: bool = False) -> list[dict]:
    """Run (or continue) the demo under ``out``; returns the TTA rows (CER then WER, the paper's
    targets; a row per seed's run), each naming the workload (model, parameters).

    ``preset`` None: the machine's (:func:`pick_preset`); any preset (or TOML file) runs, its
    audio hours from PRESET_HOURS, else DEFAULT_HOURS. ``seeds``: None, one run in ``DIR/run``
    with the preset's seed; else those seeds (:func:`demo_folder`),
    ``parallel`` at a time (drive/seed_slots.py: one GPU each, or the CPUs shared). ``sweep``
    False: no beam sweep after training (a short check that needs the TTA and the report only).
    ``allow_emulated``: train in a precision this CPU only emulates (``--allow-emulated``; else exit 2)."""
    out = Path(out)
    preset, why, cfg, overrides = _demo_config(preset, list(overrides), minutes, seeds, parallel)
    say = (lambda msg: None) if quiet else _say
    runs = [out / "run"] if seeds is None else [demo_folder(out, s) for s in seeds]
    statuses = [_finished_status(run) for run in runs]  # a damaged run folder refused now, by name
    hours = hours or PRESET_HOURS.get(preset, DEFAULT_HOURS)
    say(f"preset {preset!r} ({why}): workload {workload_label(workload(cfg.to_dict()))}, {hours:g} h of audio")
    t0 = time.perf_counter()
    _corpus_and_features(out, hours, quiet, say, t0)
    for run, status in zip(runs, statuses):
        if status is not None:
            say(f"{run} already finished ({status}); delete it to train anew")
        else:
            say(f"{'resuming' if has_checkpoint(run) else 'training'} preset {preset!r} -> {run} "
                f"({time.perf_counter() - t0:.0f} s so far)")
    _train_demo(preset, out, runs, overrides, seeds, parallel, quiet, say, allow_emulated)
    if sweep:
        _beam_sweep(runs[0], say)  # Table 3 is the decoder's trade-off of one model: the first seed's
    _report(runs, out / "report", say)
    _say_reproduction(runs, say)
    if len(runs) == 1:
        say(one_seed(preset))
    else:
        _say_groups(runs, say)
    say(f"done in {(time.perf_counter() - t0) / 60:.1f} min")
    return [row for metric in PAPER for row in tta_table(runs, metric=metric, targets="paper")]


def _demo_config(preset: str | None, overrides: list, minutes: float | None, seeds, parallel: int):
    """(preset, why it was chosen, its RunConfig, the overrides): a bad preset, seed override or
    ``--parallel`` refused before minutes of synthesis."""
    if seeds is not None:
        refuse_seed_override(overrides)
    if parallel != 1 and seeds is None:
        raise ConfigError(f"--parallel {parallel} without --seeds: it places seeds side by side")
    if minutes is not None:
        overrides.append(f"train.stop.time_cap_minutes={minutes}")
    why = "given"
    if preset is None:
        preset, why = pick_preset()
        why += "; --preset overrides"
    return preset, why, load_preset(preset, overrides), overrides


def _corpus_and_features(out: Path, hours: float, quiet: bool, say, t0: float) -> None:
    """The demo's synthetic corpus and its features (each kept where already made)."""
    say(f"corpus -> {out / 'corpus'}")
    synth.synthesize(out / "corpus", hours=hours, seed=1, progress=not quiet)
    say(f"features -> {out / 'features'} ({time.perf_counter() - t0:.0f} s so far)")
    features_prepare.prepare(out / "corpus", out / "features", progress=not quiet)


def _train_demo(preset: str, out: Path, runs: list[Path], overrides: list, seeds, parallel: int, quiet: bool,
                say, allow_emulated: bool = False) -> None:
    """Train (or continue) the demo's run, or its seeds ``parallel`` at a time."""
    request = TrainRequest(preset, out / "features", runs[0] if seeds is None else out, overrides, resume="auto",
                           quiet=quiet, check=run_check, allow_emulated=allow_emulated)
    if seeds is None:
        train(request)
    elif parallel > 1:  # as below, `parallel` seeds at a time, each its own process
        train_seeds_parallel(seeds, parallel, request, folder=demo_folder, say=say)
    else:  # finished seeds are only read again; the first seed that fails stops the demo (exit 1)
        train_seeds(seeds, request, folder=demo_folder)


def _say(msg: str) -> None:
    """A line of the demo's progress, wrapped to the terminal's 100 columns (tables.WIDTH)."""
    print_lines([f"[demo] {msg}"])
    sys.stdout.flush()


def summary(rows: list[dict], report: Path) -> list[str]:
    """The demo's last five lines, from its TTA rows (``run_demo``'s): what was timed, the TTA of
    the first run (the tightest target of the first metric it reached, else its first), where
    that time went, the efficiency, and where the report is; each within 100 characters but
    the report's path, which stays whole."""
    first = [r for r in rows if r["run"] == rows[0]["run"] and r["metric"] == rows[0]["metric"]]
    row = ([r for r in first if r["minutes"] is not None] or first[:1])[-1]
    targets = {r["metric"]: "/".join(f"{x['target']:g}" for x in rows if x["run"] == row["run"]
                                      and x["metric"] == r["metric"]) for r in rows}
    runs = len({r["run"] for r in rows})
    lines = [f"timed: {row['workload']} on {row['machine']}, to "
             + ", ".join(f"{metric_of(m).label} {t}" for m, t in targets.items()) + f" ({runs} run{'s' * (runs > 1)})",
             f"TTA: {_tta_words(row)}",
             f"where it went: {_parts_words(row.get('time parts s'))}" + ("" if row["minutes"] is not None
                                                                           else " (to the last evaluation)"),
             f"efficiency: MFU {_fmt(row.get('MFU %'), '.3g', '%')}, {_fmt(row.get('TFLOPS'), '.3g', ' TFLOPS')}; "
             f"to accuracy: {to_accuracy(row)}"]
    return [fit_line(line) for line in lines] + [f"report: {report}"]


def _tta_words(row: dict) -> str:
    """``CER 10 in 3.21 min (8 epochs; error 9.36 [8.10, 10.70])``, or what to do where it was not reached."""
    if row["minutes"] is None:
        return f"{target_text(row)} not reached: train longer (--minutes) or on more audio (--hours)"
    epochs = row["epochs to target"]
    error = with_interval(row["error at TTA"], row["error 95% low"], row["error 95% high"])
    return (f"{target_text(row)} in {row['minutes']:.3g} min ({epochs} epoch{'s' * (epochs != 1)}"
            + (f"; error {error})" if error else ")"))


def _parts_words(parts: dict | None) -> str:
    """``steps 70%, data 17%, eval 7%``: the shares of the time, largest first, those under 1% left out."""
    if not parts or not parts.get("total s"):
        return "not recorded"
    shares = sorted(((100 * parts[f"{p} s"] / parts["total s"], SHORT[p]) for p in PARTS), reverse=True)
    return ", ".join(f"{name} {pct:.0f}%" for pct, name in shares if pct >= 0.5)


def _fmt(value, spec: str, unit: str) -> str:
    return "not measured" if value is None else f"{value:{spec}}{unit}"


def _say_groups(runs: list[Path], say) -> None:
    """The seeds aggregated, per target reached by any: how many reached it, median TTA and the
    epochs to target per seed (their spread is the recipe's, not the machine's)."""
    for metric in PAPER:
        for g in tta_study(runs, metric=metric, targets="paper")["groups"]:
            if g["reached"]:
                median = g["median TTA min"]
                say(f"{len(runs)} seeds, {metric.upper()} {g['target']:g}: {g['reached']} of {g['runs']} reached it, "
                    f"median TTA {'-' if median is None else f'{median:.2f}'} min, epochs to target per seed "
                    f"{g['epochs to target per seed']}")


def _say_reproduction(runs: list[Path], say) -> None:
    """Each run's first epochs against its reference seed's curve (studies/curve.py), where it has one."""
    for run in runs:
        with RunView.open(run) as r:
            found = ((r.summary() or {}).get("convergence") or {}).get("reproduction")
        if found:
            say(f"{run.name}: {found['text']}")


def _finished_status(run: Path) -> str | None:
    """The status of a finished run in ``run`` (None: none there, or one to continue); a
    damaged run folder is refused by name (RunView reads every JSON file it holds)."""
    if not is_run(run):
        return None
    with RunView.open(run) as r:
        return str(r.summary().get("status", "")) if r.finished else None


def _beam_sweep(run: Path, say) -> None:
    """Evaluation seconds and every declared metric per beam width of the final model, once per run."""
    with RunView.open(run) as r:
        if r.rows.beam_sweep():
            return
    say(f"beam sweep on dev-clean, widths {', '.join(map(str, SWEEP_WIDTHS))}")
    for r in beam_sweep(run, list(SWEEP_WIDTHS), split="dev-clean"):
        rates = "  ".join(f"{m.label} {r[m.name]:{m.fmt}}" for m in held([r]))
        say(f"  width {r['beam']:>4}: {rates}  ({r['eval_s']:.1f} s)")


def _report(runs: list[Path], out: Path, say) -> None:
    path = build_report(runs, out)
    say(f"report: {path}")
