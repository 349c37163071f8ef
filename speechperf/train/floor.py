"""The run's step against its floor, measured by the run itself after training (outside the TTA clock).

The floor is the same training step on the same batches with nothing else: the batches already
on the device, no loader, no rows, no logging, no checkpoints. One figure from one moment
describes that moment (a demo's 10 steps at the start of epoch 2 held a 2.7 s and a 1.7 s step
while another process shared the machine: loop/floor 1.88, where its median step was at its
floor), so the run replays a sample of its recorded iterations spread over all its epochs:
``train.floor.steps`` timed steps in windows of ``span`` steps: ``train.floor.window`` rounded up
to whole ``train.system.sync_every`` periods (a GPU's host times only mean something over a read period,
so a window ends where the loop reads the device; on a CPU, where the loop reads every step, one
step's seconds vary by tens of percent and a window of several steps times steadier), each window
led by its row's previous iteration, replayed untimed (the loop's step before it, whose read falls
in the first timed step as in the loop). The asked windows are spread evenly over the rows that
can end one (:func:`candidates`), each window's batches rebuilt by a loader started at its batch
(the seed's plan: data/plan.py makes them the same), and each step timed as the loop times its
rows: host seconds from one step's end to the next's, reads included. Against it, the same
iterations' rows: their ``step_s`` less the wait for data and the checkpoints written inside them
(studies/time_parts.py's "steps").

Each window is compared by FLOP rate: the floor's over the loop's for the same batches (the
same FLOPs, so it is the loop's seconds over the floor's). The result is their median with its
10th and 90th percentiles; a window more than :data:`OUTLIER` times the median is named by its
iterations. Beside it, the floor's median FLOP rate over the run's median one over all its rows
(``run_over_floor``): whether the sample describes the run. 1.0 is a loop that costs what the
hardware costs; the rest is what the loop adds (logging, rows, sentences, the readers beside it
on the host, or another process on the machine: telemetry/contention.py flags that apart).

Cost: two passes of ``windows x (span + 1)`` steps plus one loader start per window, bounded by
``train.floor.steps`` and by :data:`BUDGET` of the run's clock: fewer windows where the asked
ones would take more at the rows' median step, and a deadline at that budget, since the estimate
can be wrong (a neighbour slowed a tiny run's replay to 4x its loop step: 20% of its clock).
The windows are replayed in an order whose every prefix is spread over the run
(:func:`spread_order`), the budget keeping a prefix of the asked windows (a rerun that affords one
window more or less compares the same ones but that); the first pass stops half way to the
deadline, the second at it, and the windows both replayed (at least one) are compared. The result
records the seconds the measurement took (``replay_s``). The replay runs twice and the second pass
is timed: after the final evaluation's other shapes, a first pass may pay first-use costs the
loop's steady state did not (primitive and plan caches, the allocator's blocks; a CPU demo's one
pass read the floor 7% slower than the loop, 0.973 against 0.909 s a step). The run's model,
optimizer and scaler train the replay (the run's compiled graphs, warm allocator) and are put back
afterwards as a checkpoint restores them, RNG streams included: what the run saved and evaluated
is unchanged. A replayed batch that differs from its row (size or frames) is not compared: the
result says so.
"""
from __future__ import annotations

import copy
import math
import time
from types import SimpleNamespace

import numpy as np
import psutil
import torch

from speechperf.hardware.measured_peak import busy_seconds
from speechperf.results.checkpoint import RNG
from speechperf.telemetry import contention
from speechperf.rng import rng_state
from speechperf.train.step import StepMeter, read_point, train_step

OUTLIER = 1.5  # a window whose loop/floor exceeds the median's by this factor is named
BUDGET = 0.10  # the two replay passes may take this share of the run's clock (estimated from its median step)
NAMED = 5  # outlier windows named at most (the worst)


def resident(batch, device: torch.device):
    """The batch with its big tensors on the device (lengths stay on the host, as the
    step plans with them there)."""
    return SimpleNamespace(feats=batch.feats.to(device), labels=batch.labels.to(device),
                           feat_lens=batch.feat_lens, label_lens=batch.label_lens, ids=batch.ids)


def window_span(tc) -> int:
    """The timed steps of one window: ``train.floor.window`` rounded up to whole ``sync_every``
    periods (0: one period), at most ``floor_steps``."""
    period = tc.system.sync_every
    periods = max(1, math.ceil(tc.floor.window / period))  # floor_window 0: one period
    return max(1, min(period * periods, tc.floor.steps))


def loop_seconds(row: dict) -> float:
    """A row's step as time_parts counts it: its seconds less the wait for data and the
    checkpoints written inside it."""
    return row["step_s"] - (row.get("data_s") or 0.0) - (row.get("ckpt_s") or 0.0)


def candidates(rows: list[dict], span: int) -> list[int]:
    """Indices ``i`` of ``rows`` (sorted by iteration) that can end a window: ``rows[i - span : i + 1]``
    are contiguous iterations of one epoch (a lead and ``span`` timed steps, none of them the
    epoch's first, which holds its start) and ``rows[i]``'s iteration is a multiple of ``span``
    (the loop reads the device there when ``span`` is its ``sync_every``)."""
    return [i for i in range(span, len(rows))
            if rows[i]["iteration"] % span == 0 and rows[i]["iteration"] - rows[i - span]["iteration"] == span
            and rows[i]["epoch"] == rows[i - span]["epoch"]]


def affordable(rows: list[dict], span: int) -> int | None:
    """How many windows two passes can replay within :data:`BUDGET` of the run's clock, from its
    rows' median step (at least 1); None where the rows hold no clock."""
    clock = max((r.get("clock_s") or 0.0 for r in rows), default=0.0)
    step = float(np.median([loop_seconds(r) for r in rows])) if rows else 0.0
    if clock <= 0 or step <= 0:
        return None
    return max(1, int(BUDGET * clock / (2 * (span + 1) * step)))


def pick_windows(iterations: list[dict], windows: int, span: int) -> list[list[dict]]:
    """Up to ``windows`` windows of ``span`` + 1 rows (the first untimed), spread evenly over the
    rows that can end one: every epoch's steps where there are enough windows."""
    rows = sorted(iterations, key=lambda r: r["iteration"])
    ends = candidates(rows, span)
    count = min(windows, len(ends))
    return [rows[e - span: e + 1] for e in (ends[int((k + 0.5) * len(ends) / count)] for k in range(count))]


def unit(rows: list[dict], times: list[float]) -> dict:
    """One window compared: its timed rows (all but the lead) against its replayed seconds."""
    timed, floor_s = rows[1:], sum(times[1:])
    loop_s = sum(loop_seconds(r) for r in timed)
    flops = [r.get("model_flops") for r in timed]
    return {"iteration": timed[0]["iteration"], "last": timed[-1]["iteration"], "epoch": timed[0]["epoch"],
            "loop_s": loop_s, "floor_s": floor_s, "flops": sum(flops) if None not in flops else None,
            "ratio": loop_s / floor_s if floor_s > 0 else None}


def run_rate(iterations: list[dict]) -> float | None:
    """The run's median FLOP rate (FLOP/s) over its rows, each epoch's first (its start) left out;
    None where its rows hold no FLOPs."""
    rows = sorted(iterations, key=lambda r: r["iteration"])
    rates = [b["model_flops"] / loop_seconds(b) for a, b in zip(rows, rows[1:])
             if a["epoch"] == b["epoch"] and b.get("model_flops") and loop_seconds(b) > 0]
    return float(np.median(rates)) if rates else None


def compare(units: list[dict], run_flops_s: float | None) -> dict:
    """The windows' loop/floor: median, 10th and 90th percentiles, the outliers (ratio over
    :data:`OUTLIER` x the median, worst first, at most :data:`NAMED`), the floor's median FLOP
    rate and the run's, and their ratio (``run_over_floor``: the run's median step against the floor)."""
    ratios = np.array([u["ratio"] for u in units if u["ratio"] is not None], dtype=float)
    if not len(ratios):
        return {"loop_over_floor": None, "note": "not compared: the replayed steps took no time"}
    median = float(np.median(ratios))
    out = sorted((u for u in units if u["ratio"] is not None and u["ratio"] > OUTLIER * median),
                 key=lambda u: -u["ratio"])
    rates = [u["flops"] / u["floor_s"] for u in units if u["flops"] and u["floor_s"] > 0]
    floor_rate = float(np.median(rates)) if rates and len(rates) == len(units) else None
    return {"loop_over_floor": median, "loop_over_floor_p10": float(np.percentile(ratios, 10)),
            "loop_over_floor_p90": float(np.percentile(ratios, 90)),
            "outliers": [{"iteration": u["iteration"], "last": u["last"], "ratio": u["ratio"]} for u in out[:NAMED]],
            "outlier_count": len(out), "floor_tflops": floor_rate / 1e12 if floor_rate else None,
            "loop_tflops": run_flops_s / 1e12 if run_flops_s else None,
            "run_over_floor": floor_rate / run_flops_s if floor_rate and run_flops_s else None, "note": None}


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
    began, steps = time.perf_counter(), t.cfg.train.floor.steps
    span = window_span(t.cfg.train)
    windows = pick_windows(iterations, max(1, steps // span), span)
    if not windows:
        return {"steps": steps, "note": f"not measured: no epoch trained {span + 1} steps in a row (a lead and "
                                        f"{span} timed; train.floor.steps={steps})"}
    # any first few of them spread over the run; the budget keeps a prefix (None: no clock, all of them)
    windows = [windows[i] for i in spread_order(len(windows))][:affordable(iterations, span)]
    batches = _load(t, windows, iterations)
    if isinstance(batches, dict):
        return {**batches, "steps": steps}
    clock = max((r.get("clock_s") or 0.0 for r in iterations), default=0.0)
    before, replay_t0 = busy_seconds(), time.perf_counter()
    times = _replayed(t, batches, windows, began + BUDGET * clock if clock > 0 else None)
    others = _others(before, busy_seconds(), time.perf_counter() - replay_t0)
    units = [unit(rows, ts) for rows, ts in zip(windows, times)]  # the windows replayed before the deadline
    timed = [r for rows in windows[:len(times)] for r in rows[1:]]
    return {"steps": len(timed), "asked": steps, "span": span, "windows": len(units),
            "epochs": len({r["epoch"] for r in timed}), "first_iteration": min(r["iteration"] for r in timed),
            "last_iteration": max(r["iteration"] for r in timed),
            "floor_s": sum(u["floor_s"] for u in units) / len(timed),
            "loop_s": sum(u["loop_s"] for u in units) / len(timed),
            "utterances": sum(r["batch_size"] for r in timed) / len(timed), **compare(units, run_rate(iterations)),
            "window_s": [[u["iteration"], round(u["loop_s"], 5), round(u["floor_s"], 5)]  # each window, by iteration
                         for u in sorted(units, key=lambda u: u["iteration"])],
            "replay_s": time.perf_counter() - began, "clock_s": clock, "replay_others_pct": others,
            "replay_shared": contention.took_needed(others, torch.get_num_threads(), psutil.cpu_count() or 1)}


def _others(before: tuple[float, float], after: tuple[float, float], wall_s: float) -> float:
    """The share (%) of the machine's CPUs other processes used while the replay ran, between two
    hardware/measured_peak.busy_seconds readings: a floor measured beside a neighbour is said to be."""
    return contention.others_pct(after[0] - before[0], after[1] - before[1], wall_s, psutil.cpu_count() or 1)


def spread_order(n: int) -> list[int]:
    """0..n-1 in van der Corput order (8: 0 4 2 6 1 5 3 7): any first k of the windows, in
    iteration order, lie spread over the run, so a replay stopped by its deadline still is."""
    def reversed_bits(i: int) -> float:
        x, scale = 0.0, 0.5
        while i:
            x, i, scale = x + scale * (i & 1), i >> 1, scale / 2
        return x
    return sorted(range(n), key=reversed_bits)


def _load(t, windows: list[list[dict]], iterations: list[dict]) -> list[list] | dict:
    """Each window's batches on the device, each from a loader started at its lead's batch; the
    reason (``epoch``, ``note``) where a batch is not the one its row recorded (size or frames)."""
    batches = []
    for rows in windows:
        got = _batches(t, rows[0]["epoch"], _index(rows[0], iterations), len(rows))
        differs = next((r["iteration"] for b, r in zip(got, rows)
                        if len(b.feat_lens) != r["batch_size"] or int(b.feat_lens.sum()) != r["frames"]), None)
        if len(got) < len(rows) or differs is not None:
            at = differs if differs is not None else rows[len(got)]["iteration"]
            return {"epoch": rows[0]["epoch"], "note": f"not compared: epoch {rows[0]['epoch']}'s replayed batch of "
                                                       f"iteration {at} is not the one its row recorded"}
        batches.append(got)
    return batches


def _index(row: dict, iterations: list[dict]) -> int:
    """``row``'s batch within its epoch: its iteration less the epoch's first recorded one."""
    return row["iteration"] - min(r["iteration"] for r in iterations if r["epoch"] == row["epoch"])


def _batches(t, epoch: int, start: int, count: int) -> list:
    """``count`` batches of ``epoch`` from its batch ``start`` on, as the run's loader made them, on the device."""
    loader = t.epoch_loader(epoch, start, readers=0)  # a few batches: no reader process to start per window
    try:
        out = []
        for batch in loader:
            out.append(resident(batch, t.group.device))
            if len(out) == count:
                break
        return out
    finally:
        loader.close()


def _replayed(t, batches: list[list], windows: list[list[dict]], deadline: float | None) -> list[list[float]]:
    """The second of two passes of :func:`replay` over the windows, on the run's own model and
    optimizer, put back afterwards as a checkpoint restores them (results/checkpoint.py's
    TrainState), RNG streams included: each window's step seconds. The first pass stops after the
    window that passes half the way to ``deadline`` (perf_counter; None: none), the second after the
    one that passes it: the windows both passes replayed (at least one) are those compared."""
    state, device, training = t.state, t.group.device, t.model.training
    saved = {**copy.deepcopy(state.state_dict()), RNG: rng_state()}
    start = time.perf_counter()
    try:
        t.model.train()
        times: list[list[float]] = []
        for stop in ((start + deadline) / 2 if deadline else None, deadline):  # warm (untimed), then timed
            done, times = len(times) or len(windows), []
            for b, rows in zip(batches[:done], windows[:done]):
                times.append(replay(b, rows[0]["iteration"], t.model, state, device, t.cfg))
                if stop is not None and time.perf_counter() > stop:
                    break
        return times
    finally:
        t.model.train(training)
        state.load(saved)
