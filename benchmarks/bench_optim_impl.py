"""The optimizer's kernels inside a preset's training step: ``train.optim.impl`` default, foreach, fused,
and the copy-back that undid a non-finite step before.

Why: the step undoes a non-finite step (train/step.py ``masked_step``). Without a host read that
costs, with torch's single-tensor or foreach optimizer, a copy of every parameter and optimizer
state before the step and a ``where`` back after it (``copy_back_step``: four tensors a parameter
for AdamW, ~2,200 small kernels a step for transducer-cpu's 136 parameters). A fused optimizer
takes the flag as its ``found_inf`` and skips the update itself; on a CPU the flag is read (a CPU
tensor waits for nothing) and the step skipped, with the same numbers as the copy-back. The
``copy-back`` arm is the default step undone the old way, the reference. ``train.optim.impl`` is not
part of a reference's recipe (studies/rcp.py NOT_RECIPE): it changes the step's time, not what is
trained.

Each arm trains its own model (same seed) on the same batches resident in memory; the arms take
turns, a pass over the batches each, for ``--rounds`` rounds, and each one's median pass is
compared (alternating keeps a drifting machine's speed out of the ratio).

Usage: python benchmarks/run.py optim_impl [--data FEATS] [--preset transducer-cpu] [--device auto]
           [--precision fp32|bf16] [--steps 10] [--rounds 5] [key=value ...]
"""
from __future__ import annotations

import statistics

import torch

from bench_step_floor import cached_batches, load, run_steps, setup
from speechperf.train import step as step_module

GOAL = ("docs/bench.md: a preset's step without the copy-back of parameters and state (a CPU's read of the flag, a "
        "fused optimizer's found_inf) faster than the copy-back step, the same optimizer and batches")
REFERENCE = ("the single-tensor step undone by copies where a step is not finite (train/step.py copy_back_step, the "
             "default step on a CPU before it read the flag)")
RATIO = "default / copy-back (median pass)"
DATA = True
ARMS = {"copy-back": "default", "default": "default", "foreach": "foreach", "fused": "fused"}  # arm: train.optim.impl


def arguments(p) -> None:
    p.add_argument("--preset", default="transducer-cpu")
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", choices=["fp32", "bf16"], default=None, help="default: the preset's")
    p.add_argument("--steps", type=int, default=10, help="timed steps a pass")
    p.add_argument("--rounds", type=int, default=5, help="passes of each implementation, taken in turn")
    p.add_argument("overrides", nargs="*")


def run(a) -> dict:
    arms = {}
    for arm, impl in ARMS.items():  # the config differs in the implementation alone
        cfg, device, note = load(a.preset, a.device, a.precision, [*a.overrides, f"train.optim.impl={impl}"],
                                 "bench_optim_impl")
        arms[arm] = (cfg, setup(cfg, device))
    batches = cached_batches(a.data, cfg, device, a.steps + 1)
    passes: dict[str, list[float]] = {arm: [] for arm in ARMS}

    def one_pass(arm: str) -> float:
        cfg, parts = arms[arm]
        masked = step_module.masked_step
        if arm == "copy-back":  # train_step looks masked_step up at each call
            step_module.masked_step = step_module.copy_back_step
        try:
            return run_steps(batches, *parts, device, cfg.train, 1, cfg.augment)[0]
        finally:
            step_module.masked_step = masked

    for arm in ARMS:  # untimed: each optimizer creates its state on its first step
        one_pass(arm)
    for _ in range(a.rounds):
        for arm in ARMS:
            passes[arm].append(one_pass(arm))
    med = {arm: statistics.median(v) for arm, v in passes.items()}
    print(f"preset {a.preset}, {device}, {cfg.train.system.precision}, {cfg.train.optim.name}, threads "
          f"{torch.get_num_threads()}, {a.steps} steps a pass, {a.rounds} rounds" + (f"; {note}" if note else ""))
    print(f"{'arm':<11}{'s/step (median)':>16}{'min':>9}{'max':>9}{'/ copy-back':>13}")
    for arm in ARMS:
        v = passes[arm]
        print(f"{arm:<11}{med[arm]:>16.4f}{min(v):>9.4f}{max(v):>9.4f}{med[arm] / med['copy-back']:>13.3f}")
    return {"preset": a.preset, "device": str(device), "precision": cfg.train.system.precision,
            "threads": torch.get_num_threads(), "steps": a.steps, "rounds": a.rounds,
            **{f"{arm.replace('-', '_')}_s": med[arm] for arm in ARMS}, "ratio": med["default"] / med["copy-back"],
            "fused_ratio": med["fused"] / med["copy-back"]}
