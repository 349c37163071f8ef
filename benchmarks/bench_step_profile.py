"""Where the training step's and the evaluation's time goes: torch.profiler over the preset's real ones.

The step is the loop's (``speechperf.train.step.train_step`` with the preset's SpecAugment) on
batches already on the device (bench_step_floor.py's: the loader's first batches of epoch 1, so
no loader or host-to-device copy of the features is in it; the loop's loss reads, one per
``train.system.sync_every`` steps, are not either). The loop step is the same step as the training loop
takes it: from a running loader of epoch 1 (its readers still producing, batches pinned on a
CUDA device, copies to the device, a loss read every ``train.system.sync_every`` steps), after
``--warmup`` of its batches; each measurement takes the loader's next ``--steps`` batches, so
its figures against the train step's say what the loader's work beside the step costs it. The
evaluation is one per-epoch pass
(``speechperf.train.evaluate.evaluate`` on ``train.eval.split`` with the preset's decoder, beam,
mode and threads, as the loop calls it) after the run's initialization (train/warmup.py: decoders
built, the split's batches kept resident).

Per step (training) and per pass (evaluation): the wall time unprofiled (the reference, measured
in the same process on the same batches) and under the profiler, the host time inside top-level
aten ops and blocked in host syncs, the kernels' device time and the device's busy share (kernel
time / the unprofiled wall), kernels, kernel launches, host syncs and where they sit (benchmarks/
_op_profile.py); then the host syncs by site, the top 12 host ops by self CPU time and the top 8
kernels by device time. On a GPU the steps run once more under
``torch.cuda.set_sync_debug_mode("warn")`` (the evaluation too with --debug-eval): the warnings it
gives, counted by the Python line that made the synchronizing call. On a CPU the device columns
read n/a.

Usage: python benchmarks/run.py step_profile [--data FEATS] [--preset P ...] [--device auto]
           [--steps 3] [--warmup 3] [--trace PATH] [--debug-eval] [--json] [key=value ...]
--json prints one JSON object per preset as its profile ends (so a cut run keeps the presets done);
--trace PATH writes each phase's chrome trace to PATH-PRESET-PHASE.json (tens of MB on a GPU).
"""
from __future__ import annotations

import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from _op_profile import MARK, device_events, phase_tables
from _timing import sync
from bench_step_floor import cached_batches, first_batches, load, setup
from speechperf.data.batching import Batching
from speechperf.errors import SpeechperfError
from speechperf.tables import emit, emit_json
from speechperf.train.evaluate import evaluate, release_resident
from speechperf.train.step import StepMeter, read_point, train_step
from speechperf.train.warmup import initialize

GOAL = "docs/gpu.md: GPU busy >= 85% inside training (the train step's busy %), the loop within 15% of its floor"
REFERENCE = "the train step: the same step on batches resident on the device, unprofiled"
RATIO = "loop step / train step"
DATA = True

ROOT = Path(__file__).resolve().parents[1]
SYNC_WARNING = "synchronizing CUDA operation"  # torch's message under set_sync_debug_mode("warn")
COLUMNS = ["phase", "unprofiled ms", "profiled ms", "host ops ms", "sync wait ms", "kernel ms", "busy %", "kernels",
           "launches", "syncs", "top sync site"]


def timed(fn, device: torch.device) -> float:
    """Seconds of ``fn``, from a synchronized device to a synchronized device."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def traced(fn, cuda: bool):
    """``fn``'s result and its profile (host ops, and the CUDA runtime and kernels on a GPU)."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        out = fn()
    return out, prof


def sync_warnings(fn, count: int) -> list[dict]:
    """``fn`` (``count`` steps or passes) under ``set_sync_debug_mode("warn")``: its warnings per
    step by the Python line that made the synchronizing call."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    where = Counter(f"{_short(w.filename)}:{w.lineno}" for w in got if SYNC_WARNING in str(w.message))
    return [{"python line": k, "per step": round(n / count, 2)} for k, n in where.most_common()]


def _short(filename: str) -> str:
    path = Path(filename)
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else "/".join(path.parts[-3:])


def phase(name: str, fn, count: int, device: torch.device, trace: str | None, debug: bool) -> dict:
    """``fn`` (``count`` steps or passes, each inside a ``MARK`` range) once unprofiled (the
    reference), once profiled, and with ``debug`` on a GPU once under the sync debug mode: its
    tables. A GPU trace without device activity (CUPTI unavailable) is said so, its device
    columns n/a, never zeros."""
    cuda = device.type == "cuda"
    ref = timed(fn, device) / count
    wall, prof = traced(lambda: timed(fn, device) / count, cuda)
    if trace:
        prof.export_chrome_trace(f"{trace}-{name.replace(' ', '_')}.json")
    events = prof.events()
    if cuda and not device_events(events):
        print(f"bench_step_profile: {name}: the profiler recorded no CUDA activity (CUPTI unavailable?): "
              "device columns n/a", file=sys.stderr)
        cuda = False
    out = phase_tables(name, events, count, wall, ref, cuda)
    out["sync warnings"] = sync_warnings(fn, count) if cuda and debug else None
    return out


def train_phase(a, cfg, device: torch.device):
    """The preset's model after ``--warmup`` steps and one untimed pass over the ``--steps`` batches,
    and the profile of those batches' steps."""
    model, opt, scaler = setup(cfg, device)
    batches = cached_batches(a.data, cfg, device, a.warmup + a.steps)

    def steps(which):
        for b in which:
            with record_function(MARK + "train_step"):
                train_step(model, b, opt, scaler, device, cfg.train, cfg.augment)

    timed(lambda: steps(batches[:a.warmup]), device)
    # the profiled batches once more, untimed: the one-time costs of their shapes (cuDNN's and oneDNN's
    # plans) stay out of the reference, as the warm pass keeps them out of the evaluation's
    timed(lambda: steps(batches[a.warmup:]), device)
    utts = sum(len(b.feat_lens) for b in batches[a.warmup:]) / a.steps
    return model, utts, phase("train step", lambda: steps(batches[a.warmup:]), a.steps, device, a.trace_prefix,
                               debug=True)


def loop_phase(a, cfg, device: torch.device) -> dict:
    """The step inside the loop's surroundings (a running loader, pinned copies, the reads):
    ``--warmup`` batches, then a take of ``--steps`` batches each for the reference, the profile
    and (on a GPU) the sync debug mode, all from one loader."""
    model, opt, scaler = setup(cfg, device)
    tc, meter = cfg.train, StepMeter()
    need = a.warmup + (3 if device.type == "cuda" else 2) * a.steps  # the debug take runs on a GPU only
    batches = first_batches(a.data, cfg, need, device)
    done = [0]

    def steps(n: int) -> None:
        for k in range(n):
            b = next(batches, None)
            if b is None:
                raise SystemExit(f"bench_step_profile: {a.data} gives {done[0]} batches with these settings; the "
                                 f"loop step needs {need} (fewer --steps or --warmup)")
            done[0] += 1
            with record_function(MARK + "train_step"):
                meter.add(done[0], train_step(model, b, opt, scaler, device, tc, cfg.augment))
            if read_point(done[0], tc):
                meter.read()
        meter.read()

    timed(lambda: steps(a.warmup), device)
    out = phase("loop step", lambda: steps(a.steps), a.steps, device, a.trace_prefix, debug=True)
    batches.close()  # its readers stop
    return out


def eval_phase(a, cfg, model, device: torch.device) -> tuple[dict, dict]:
    """The run's initialization, one warm evaluation pass, then the profiled phase."""
    tc = cfg.train
    initialize(model, cfg, Batching(cfg.loader), a.data, device)

    def one():
        with record_function(MARK + "evaluate"):
            return evaluate(model, a.data, tc.eval.split, Batching(cfg.loader), device, decoder=tc.eval.decoder,
                            beam=tc.eval.beam, precision=tc.system.precision, mode=tc.eval.mode, workers=tc.eval.threads,
                            keep_pairs=3, intervals=False)  # as the loop's per-epoch evaluation

    first = one()
    return first, phase("evaluation", one, 1, device, a.trace_prefix, debug=a.debug_eval)


def profile_preset(a, preset: str) -> dict:
    cfg, device, note = load(preset, a.device, None, a.overrides, "bench_step_profile")
    a.trace_prefix = f"{a.trace}-{preset}" if a.trace else None
    model, utts, train = train_phase(a, cfg, device)
    loop = loop_phase(a, cfg, device)
    first, ev = eval_phase(a, cfg, model, device)
    tc, name = cfg.train, torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    head = (f"preset {preset}: {device} ({name}), {tc.system.precision}, {utts:.0f} utt per batch ({cfg.loader.mode}), "
            f"{a.steps} profiled steps after {a.warmup} warm-up; evaluation of {tc.eval.split} "
            f"({first['n_utts']} utt): {first['decoder']} beam {first['beam']}, "
            f"{first['decode_threads']} decode threads, batches {first['eval_data']}" + (f"; {note}" if note else ""))
    del model
    release_resident()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"preset": preset, "head": head, "phases": {"train step": train, "loop step": loop, "evaluation": ev}}


def show(result: dict) -> None:
    """The preset's tables as text (n/a: a device column on a CPU)."""
    print(f"== {result['head']}")
    phases = result["phases"]
    emit([_na(p["row"]) for p in phases.values()], False, COLUMNS)
    print("profiled / unprofiled wall: " + ", ".join(
        f"{k} {p['row']['profiled ms'] / p['row']['unprofiled ms']:.2f}" for k, p in phases.items()))
    for k, p in phases.items():
        per = "per step" if k.endswith("step") else "per pass"
        for title, key in (("host syncs by site", "syncs"), ("top 12 host ops by self CPU time", "host ops"),
                           ("top 8 kernels by device time", "kernels"),
                           ("sync debug mode warnings by Python line", "sync warnings")):
            if p[key] is None:
                continue
            print(f"-- {k}: {title} ({per})")
            if p[key]:
                emit(p[key], False)
            else:  # the debug mode covers some synchronizing calls only (torch.cuda.set_sync_debug_mode)
                print("none" if key != "sync warnings" else "none: the debug mode warned of no call (it covers "
                      "some synchronizing calls only; the host syncs above are the profiler's count)")
    sys.stdout.flush()


def _na(row: dict) -> dict:
    return {k: "n/a" if v is None else v for k, v in row.items()}


def arguments(p) -> None:
    p.add_argument("--preset", action="append", help="repeat for several; profiled in order (default: cpu)")
    p.add_argument("--device", default="auto")
    p.add_argument("--steps", type=int, default=3, help="profiled training steps")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--trace", default=None, metavar="PATH", help="chrome traces at PATH-PRESET-PHASE.json")
    p.add_argument("--json", action="store_true")
    p.add_argument("--debug-eval", action="store_true",
                   help="on a GPU, one more evaluation pass under the sync debug mode (the steps always get one)")
    p.add_argument("overrides", nargs="*")


def run(a) -> dict:
    """Each preset's profile printed as it ends (so a cut run keeps the presets done); the figures of
    each: its phases' unprofiled ms and busy %; the ratio of the first."""
    if not (a.data / "features.json").is_file():
        raise SpeechperfError(f"{a.data} is not a prepared features folder (no features.json)")
    if a.steps < 1 or a.warmup < 0:
        raise SpeechperfError(f"--steps {a.steps} --warmup {a.warmup}: need steps >= 1, warmup >= 0")
    figures = {}
    for preset in a.preset or ["cpu"]:
        result = profile_preset(a, preset)
        emit_json(result) if a.json else show(result)
        sys.stdout.flush()
        rows = {k: p["row"] for k, p in result["phases"].items()}
        figures[preset] = {k: {"ms": r["unprofiled ms"], "busy_pct": r["busy %"]} for k, r in rows.items()}
        figures.setdefault("ratio", rows["loop step"]["unprofiled ms"] / rows["train step"]["unprofiled ms"])
    return figures
