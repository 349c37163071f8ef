"""The run's step against its floor, measured by the run itself after training (outside the TTA clock).

The floor is the same training step on the same batches with nothing else: the batches already
on the device, no loader, no rows, no logging, no checkpoints. The run replays the first
``train.floor_steps`` + 1 batches of one trained epoch (the second where it has that many, the
seed's plan rebuilt: data/plan.py makes it the same) through ``train_step`` with the loop's
reads at the loop's iterations, and times each step as the loop times its rows: host seconds
from one step's end to the next's, reads included. Against it, the same iterations' rows: their
``step_s`` less the wait for data and the checkpoints written inside them (studies/time_parts.py's
"steps"). Their ratio is what the loop adds to the step (logging, rows, sentences, the readers
beside it on the host): 1.0 is a loop that costs what the hardware costs.

The replay runs twice and the second pass is timed: after the final evaluation's other shapes,
a first pass may pay first-use costs the loop's steady state did not (primitive and plan caches,
the allocator's blocks; a CPU demo's one pass read the floor 7% slower than the loop, 0.973
against 0.909 s a step). The first replayed step is untimed on both sides (an epoch's first row
also holds its start).
The run's model, optimizer and scaler train the replay (the run's compiled graphs, warm allocator)
and are put back afterwards as a checkpoint restores them, RNG streams included: what the run saved
and evaluated is unchanged.
A replayed batch that differs from its row (size or frames) is not compared: the result says so.
"""
from __future__ import annotations

import copy
import time
from types import SimpleNamespace

import torch

from speechperf.results.checkpoint import RNG
from speechperf.rng import rng_state
from speechperf.train.step import StepMeter, read_point, train_step

PREFERRED_EPOCH = 2  # epoch 1's first steps pay first-use costs in the loop (shapes seen the first time)


def resident(batch, device: torch.device):
    """The batch with its big tensors on the device (lengths stay on the host, as the
    step plans with them there)."""
    return SimpleNamespace(feats=batch.feats.to(device), labels=batch.labels.to(device),
                           feat_lens=batch.feat_lens, label_lens=batch.label_lens, ids=batch.ids)


def pick_rows(iterations: list[dict], steps: int) -> tuple[int, list[dict]] | None:
    """(epoch, its first ``steps`` + 1 rows) of the epoch the floor replays: epoch 2 where it has that
    many contiguous rows, else the first later one, else epoch 1; None where none has."""
    by_epoch: dict[int, list[dict]] = {}
    for r in sorted(iterations, key=lambda r: r["iteration"]):
        by_epoch.setdefault(r["epoch"], []).append(r)
    order = sorted(by_epoch, key=lambda e: (e < PREFERRED_EPOCH, e))  # 2, 3, ..., then 1
    for epoch in order:
        rows = by_epoch[epoch][:steps + 1]
        contiguous = all(b["iteration"] == a["iteration"] + 1 for a, b in zip(rows, rows[1:]))
        if len(rows) == steps + 1 and contiguous:
            return epoch, rows
    return None


def loop_seconds(row: dict) -> float:
    """A row's step as time_parts counts it: its seconds less the wait for data and the
    checkpoints written inside it."""
    return row["step_s"] - (row.get("data_s") or 0.0) - (row.get("ckpt_s") or 0.0)


def replay(batches: list, first_iteration: int, model, state, device: torch.device, cfg) -> list[float]:
    """Host seconds of each replayed step, end to end as the loop's rows (reads at the loop's
    iterations, ``first_iteration`` being the first batch's); the device synchronized before."""
    tc, meter, times = cfg.train, StepMeter(), []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    last = time.perf_counter()
    for i, batch in enumerate(batches):
        step = train_step(model, batch, state.optimizer, state.scaler, device, tc, cfg.augment)
        now = time.perf_counter()
        times.append(now - last)
        last = now  # a read below falls in the next step's seconds, as in the loop's rows
        meter.add(first_iteration + i, step)
        if read_point(first_iteration + i, tc):
            meter.read()
    meter.read()
    return times


def measure(t, iterations: list[dict]) -> dict:
    """The floor of a run (a :class:`~speechperf.train.trainer.Trainer` that has trained; world 1)
    against its rows ``iterations``: the summary's ``floor``."""
    steps = t.cfg.train.floor_steps
    picked = pick_rows(iterations, steps)
    if picked is None:
        return {"steps": steps, "note": f"not measured: no epoch trained {steps + 1} steps (train.floor_steps={steps})"}
    epoch, rows = picked
    batches = _batches(t, epoch, len(rows))
    differs = next((i for i, (b, r) in enumerate(zip(batches, rows))
                    if len(b.feat_lens) != r["batch_size"] or int(b.feat_lens.sum()) != r["frames"]), None)
    if len(batches) < len(rows) or differs is not None:
        at = rows[differs]["iteration"] if differs is not None else rows[len(batches)]["iteration"]
        return {"epoch": epoch, "steps": steps,
                "note": f"not compared: epoch {epoch}'s replayed batch of iteration {at} is not the one its row recorded"}
    times = _replayed(t, batches, rows[0]["iteration"])
    floor, loop = sum(times[1:]) / steps, sum(loop_seconds(r) for r in rows[1:]) / steps
    return {"epoch": epoch, "first_iteration": rows[1]["iteration"], "steps": steps, "floor_s": floor, "loop_s": loop,
            "loop_over_floor": loop / floor if floor > 0 else None,
            "utterances": sum(r["batch_size"] for r in rows[1:]) / steps, "note": None}


def _batches(t, epoch: int, count: int) -> list:
    """The first ``count`` batches of ``epoch`` as the run's loader made them, on the device."""
    loader = t.epoch_loader(epoch)
    try:
        out = []
        for batch in loader:
            out.append(resident(batch, t.group.device))
            if len(out) == count:
                break
        return out
    finally:
        loader.close()


def _replayed(t, batches: list, first_iteration: int) -> list[float]:
    """The second of two :func:`replay` passes on the run's own model and optimizer, put back
    afterwards as a checkpoint restores them (results/checkpoint.py's TrainState), RNG streams included."""
    state, device, training = t.state, t.group.device, t.model.training
    saved = {**copy.deepcopy(state.state_dict()), RNG: rng_state()}
    try:
        t.model.train()
        replay(batches, first_iteration, t.model, state, device, t.cfg)  # warm: untimed
        return replay(batches, first_iteration, t.model, state, device, t.cfg)
    finally:
        t.model.train(training)
        state.load(saved)
