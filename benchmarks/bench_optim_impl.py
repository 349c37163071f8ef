"""The optimizer's kernels inside a preset's training step: ``train.optim.impl`` default, foreach, fused.

Why: the step undoes a non-finite step without a host read (train/step.py ``masked_step``). With
torch's single-tensor or foreach optimizer that costs a copy of every parameter and optimizer state
before the step and a ``where`` back after it (four tensors a parameter for AdamW: ~2,200 small
kernels a step for transducer-cpu's 136 parameters); a fused optimizer takes the flag as its
``found_inf`` and skips the update itself, copying nothing. ``train.optim.impl`` is not part of a
reference's recipe (studies/rcp.py NOT_RECIPE): it changes the step's time, not what is trained.

Each implementation trains its own model (same seed) on the same batches resident in memory; the
implementations take turns, a pass over the batches each, for ``--rounds`` rounds, and each one's
median pass is compared (alternating keeps a drifting machine's speed out of the ratio).

Usage: python benchmarks/run.py optim_impl [--data FEATS] [--preset transducer-cpu] [--device auto]
           [--precision fp32|bf16] [--steps 10] [--rounds 5] [key=value ...]
"""
from __future__ import annotations

import statistics

import torch

from bench_step_floor import cached_batches, load, run_steps, setup

GOAL = ("docs/bench.md: a preset's step with the fused optimizer (no copy-back of parameters and state) faster than with "
        "torch's default single-tensor step, the same optimizer and batches")
REFERENCE = "train.optim.impl=default: the single-tensor step, undone by copies where a step is not finite"
RATIO = "fused / default (median pass)"
DATA = True
IMPLS = ("default", "foreach", "fused")


def arguments(p) -> None:
    p.add_argument("--preset", default="transducer-cpu")
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", choices=["fp32", "bf16"], default=None, help="default: the preset's")
    p.add_argument("--steps", type=int, default=10, help="timed steps a pass")
    p.add_argument("--rounds", type=int, default=5, help="passes of each implementation, taken in turn")
    p.add_argument("overrides", nargs="*")


def run(a) -> dict:
    arms = {}
    for impl in IMPLS:  # the config differs in the implementation alone
        cfg, device, note = load(a.preset, a.device, a.precision, [*a.overrides, f"train.optim.impl={impl}"],
                                 "bench_optim_impl")
        arms[impl] = (cfg, setup(cfg, device))
    batches = cached_batches(a.data, cfg, device, a.steps + 1)
    passes: dict[str, list[float]] = {impl: [] for impl in IMPLS}
    for impl, (cfg, parts) in arms.items():  # untimed: each optimizer creates its state on its first step
        run_steps(batches, *parts, device, cfg.train, 1, cfg.augment)
    for _ in range(a.rounds):
        for impl, (cfg, parts) in arms.items():
            passes[impl].append(run_steps(batches, *parts, device, cfg.train, 1, cfg.augment)[0])
    med = {impl: statistics.median(v) for impl, v in passes.items()}
    print(f"preset {a.preset}, {device}, {cfg.train.system.precision}, {cfg.train.optim.name}, threads "
          f"{torch.get_num_threads()}, {a.steps} steps a pass, {a.rounds} rounds" + (f"; {note}" if note else ""))
    print(f"{'impl':<10}{'s/step (median)':>16}{'min':>9}{'max':>9}{'/ default':>11}")
    for impl in IMPLS:
        v = passes[impl]
        print(f"{impl:<10}{med[impl]:>16.4f}{min(v):>9.4f}{max(v):>9.4f}{med[impl] / med['default']:>11.3f}")
    return {"preset": a.preset, "device": str(device), "precision": cfg.train.system.precision,
            "threads": torch.get_num_threads(), "steps": a.steps, "rounds": a.rounds,
            **{f"{impl}_s": med[impl] for impl in IMPLS}, "ratio": med["fused"] / med["default"]}
