"""The ``cpu`` preset's training step in fp32 and in bf16 on this machine, in one process, and the
precision ``train.system.precision=auto`` picks from them (issue 60: each machine timed at its best).

The step is the run's own (train/step.py's ``train_step``: forward, CTC, backward, clipping, AdamW)
on the synthetic batch ``auto`` measures (train/auto_precision.py: with ``--data FEATS`` the
median batch the loader plans from those features, ``data_shape``, as a run does; without, the
preset's ``batch_size`` utterances of up to 600 frames, ``typical_shape``), one model per precision, one warm-up step
each, then ``--steps`` rounds of one step per precision, alternated so that a neighbour's load
falls on both alike (``auto``'s own timer, without its early drop of a slow candidate). ``auto``'s
rule: the lowest median among the precisions hardware/capability.py calls native here; bf16 is
timed where it runs at all (an emulated one too, when --emulated), fp32 always.

Usage: python benchmarks/run.py precision [--preset cpu] [--data FEATS] [--steps 5] [--threads N] [--emulated]
"""
from __future__ import annotations

import math

import torch

from speechperf.config import load_preset
from speechperf.hardware.capability import isa, cpu_flags, model_support
from speechperf.train.auto_precision import candidates, data_shape, time_candidates, typical_shape

GOAL = ("train.system.precision=auto picks the faster of the cpu preset's fp32 and bf16 steps on this machine "
        "(docs/presets.md, precision: bf16 on an AMX Xeon, fp32 on AVX2)")
REFERENCE = "the same preset's training step in fp32, alternated with bf16 in this process"
RATIO = "bf16 step / fp32 step (below 1: bf16 faster)"
DATA = False


def arguments(p) -> None:
    p.add_argument("--preset", default="cpu", help="a registered preset (cpu, conformer-cpu, ...)")
    p.add_argument("--steps", type=int, default=5, help="timed rounds (one step per precision each)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads (training's)")
    p.add_argument("--emulated", action="store_true", help="time bf16 where this CPU only emulates it too")


def run(a) -> dict:
    torch.set_num_threads(a.threads)
    cfg = load_preset(a.preset, ["train.system.precision=auto"])
    cpu = torch.device("cpu")
    native, others = candidates(cfg, cpu)
    bf16 = model_support(cfg.model, cpu, "bf16")
    timed = ["fp32"] + (["bf16"] if "bf16" in native or (bf16.runs and a.emulated) else [])
    shape = data_shape(cfg, a.data) if a.data else typical_shape(cfg)
    print(f"{a.preset}: {cfg.model.name}, batch {shape[0]} x up to {shape[1]} frames, {a.threads} thread(s), "
          f"torch {torch.__version__}, CPU {isa(cpu_flags())}; native: {', '.join(native)}"
          + "".join(f"; {p}: {why}" for p, why in others.items()))
    times = time_candidates(cfg, cpu, timed, shape, steps=a.steps, drop=math.inf)
    picked = min((p for p in native if p in times), key=times.get)
    for p in timed:
        print(f"  {p}: median step {times[p]:.3f} s")
    ratio = times["bf16"] / times["fp32"] if "bf16" in times else None
    said = f"{ratio:.3f}" if ratio is not None else f"not timed (bf16 {bf16.note or 'not native'})"
    print(f"bf16/fp32 step ratio: {said}; auto picks {picked}")
    return {"preset": a.preset, "threads": a.threads, "shape": list(shape), "native": native,
            "step_s": times, "auto_picks": picked, "ratio": ratio}
