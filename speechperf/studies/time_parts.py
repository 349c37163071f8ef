"""Where a run's time to accuracy went: training steps, waiting for data, evaluation (its
forward passes, decoding and scoring where the run split them), checkpoints, and epoch changes,
from the run's own rows (results/schema.py), so a reader sees whether a TTA is bound by the
accelerator or by the host.

The TTA clock's time up to the TTA moment is tiled by the rows' windows: an iteration row's
``[clock_s - step_s, clock_s]`` (its wait for the batch ``data_s``, the checkpoints written
since the previous row ``ckpt_s``, the rest its step), an evaluation row's
``[clock_s - eval_s, clock_s]``; the time between windows is the epochs' changes (loader start,
the model made common, bookkeeping) and the checkpoints written at an epoch's end (on the
next epoch's first row, outside its window). Each gap is measured from the rows, never
taken as what is left of the TTA: windows that overlap or a clock that jumps show as parts that
do not add up to the TTA, and the result says so.
"""
from __future__ import annotations

PARTS = ("steps", "data", "eval", "checkpoints", "epoch changes")
EVAL_PARTS = {"forward": "eval_forward_s", "decode": "eval_decode_s", "score": "eval_score_s"}
EVAL_SHORT = {"forward": "fwd", "decode": "dec", "score": "score"}  # the table cell's names
SHORT = {"steps": "steps", "data": "data", "eval": "eval", "checkpoints": "ckpt", "epoch changes": "epoch"}
TOLERANCE = 0.01  # parts within 1% of the TTA: the rows tile its clock


def time_parts(iterations: list[dict], evals: list[dict], until_s: float) -> dict:
    """{part: seconds} of the TTA clock up to ``until_s`` (the TTA moment: the clock at the
    evaluation that reached the target, or the run's last one), from the iteration rows and
    the per-epoch evaluation rows of one run; with ``total s`` (their sum), ``until s``, the
    evaluation's own parts where every row split it (else None), and a ``note`` naming what
    the rows did not record or a sum off the TTA by more than 1%."""
    its = sorted((r for r in iterations if r["clock_s"] <= until_s + 1e-6), key=lambda r: r["iteration"])
    evs = [e for e in evals if e["clock_s"] <= until_s + 1e-6]
    secs = dict.fromkeys(PARTS, 0.0)
    windows, notes = [], []
    previous_epoch = None
    for r in its:
        data, ckpt = r.get("data_s"), r.get("ckpt_s") or 0.0
        first = r["epoch"] != previous_epoch  # its window starts after the epoch's start: checkpoints before it
        previous_epoch = r["epoch"]
        inside = 0.0 if first else ckpt
        secs["data"] += data or 0.0
        secs["checkpoints"] += ckpt
        secs["steps"] += r["step_s"] - (data or 0.0) - inside
        windows.append((r["clock_s"] - r["step_s"], r["clock_s"]))
        if first:
            secs["epoch changes"] -= ckpt  # written in the gap before this window: not an epoch change
    for e in evs:
        secs["eval"] += e["eval_s"]
        windows.append((e["clock_s"] - e["eval_s"], e["clock_s"]))
    secs["epoch changes"] += gaps(windows, until_s)
    if its and any(r.get("data_s") is None for r in its):
        notes.append("data wait not recorded (rows of an older release): in steps")
    split = {name: sum(e[col] for e in evs) if evs and all(e.get(col) is not None for e in evs) else None
             for name, col in EVAL_PARTS.items()}
    total = sum(secs.values())
    if until_s > 0 and abs(total - until_s) > TOLERANCE * until_s:
        notes.append(f"parts sum to {total:.1f} s of the TTA {until_s:.1f} s: the rows' windows overlap or miss time")
    return {**{f"{p} s": v for p, v in secs.items()}, **{f"eval {n} s": v for n, v in split.items()},
            "total s": total, "until s": until_s, "note": "; ".join(notes) or None}


def decoding(evals: list[dict], until_s: float) -> dict | None:
    """How the evaluations up to ``until_s`` decoded (results/schema.py's EVALS_DECODE, summed):
    ``threads`` (the most any used), ``frames per thread-s`` (valid frames per second inside the
    decoder: the decode's rate, to set against an idle host's) and ``core share %`` (CPU seconds
    over thread-seconds: under 100 the decode threads waited for cores or the GIL, the host's
    other work beside them). None where a row holds None there (results/upgrade.py)."""
    evs = [e for e in evals if e["clock_s"] <= until_s + 1e-6 and not e.get("final")]  # the per-epoch ones
    if not evs or any(e.get("decode_busy_s") is None or e.get("decode_cpu_s") is None for e in evs):
        return None
    busy, cpu = sum(e["decode_busy_s"] for e in evs), sum(e["decode_cpu_s"] for e in evs)
    frames = sum(e["decode_frames"] or 0 for e in evs)
    return {"threads": max(e["decode_threads"] or 0 for e in evs), "frames": frames, "busy s": busy, "cpu s": cpu,
            "frames per thread-s": frames / busy if busy > 0 else None,
            "core share %": 100.0 * cpu / busy if busy > 0 else None}


def gaps(windows: list[tuple[float, float]], until_s: float) -> float:
    """Seconds of ``[0, until_s]`` outside every (start, end) window: the clock between the rows."""
    out, end = 0.0, 0.0
    for start, stop in sorted(windows, key=lambda w: w[1]):
        out += max(0.0, start - end)
        end = max(end, stop)
    return out + max(0.0, until_s - end)


def shares(parts: dict) -> str:
    """``steps 54% data 3% eval 40% ckpt 3% epoch 0%``: each part's share of the parts' sum,
    the evaluation's own parts in brackets where the run split them."""
    total = parts["total s"]
    if not total:
        return "no time recorded"
    text = [f"{SHORT[p]} {100 * parts[f'{p} s'] / total:.0f}%" for p in PARTS]
    inner = [f"{EVAL_SHORT[n]} {100 * parts[f'eval {n} s'] / total:.0f}" for n in EVAL_PARTS
             if parts[f"eval {n} s"] is not None]
    if inner:
        text[2] += f" ({' '.join(inner)})"
    return " ".join(text)


FLOOR_OFF = "not measured (train.floor.steps=0; benchmarks/run.py step_floor measures a preset apart)"


def step_vs_floor(summary: dict | None) -> str:
    """The run's step against its floor (train/floor.py: the summary's ``floor``) in words: the
    median loop/floor of the replayed sample with its 10th-90th percentiles, where the sample lay,
    the seconds a step, the run's median FLOP rate against the floor's, and the windows more than
    floor.OUTLIER x the median by iteration; the reason where it was not measured or compared."""
    floor = (summary or {}).get("floor")
    if floor is None:
        return FLOOR_OFF if summary else "not measured (the run has not finished)"
    if floor.get("loop_over_floor") is None:
        return floor.get("note") or "not measured"
    if "windows" not in floor:  # an older run's: one window at the start of one epoch
        return (f"loop/floor {floor['loop_over_floor']:.2f} ({floor['loop_s']:.4f} s against {floor['floor_s']:.4f} s "
                f"a step, {floor['steps']} steps of epoch {floor['epoch']})")
    run = floor.get("run_over_floor")
    asked = floor.get("asked") or floor["steps"]
    return (f"loop/floor {floor['loop_over_floor']:.2f} (10-90%: {floor['loop_over_floor_p10']:.2f}-"
            f"{floor['loop_over_floor_p90']:.2f}; {floor['steps']} step(s) over {floor['epochs']} epoch(s), iterations "
            f"{floor['first_iteration']}-{floor['last_iteration']}"
            + (f", {floor['steps']} of {asked} asked: the replay's budget" if floor["steps"] < asked else "")
            + f"; {floor['loop_s']:.4f} s against {floor['floor_s']:.4f} s a step"
            + (f"; the run's median step {run:.2f}" if run is not None else "") + ")" + _outliers(floor)
            + (f"; the replay shared its machine (other processes {floor['replay_others_pct']:.0f}% of its CPUs): "
               f"a floor beside a neighbour" if floor.get("replay_shared") else ""))


def _outliers(floor: dict) -> str:
    """``; outliers: iterations 85 (2.90), 86 (1.90)``: the sampled windows far above the median."""
    named = floor.get("outliers") or []
    if not named:
        return ""
    text = ", ".join((f"{u['iteration']}" if u["last"] == u["iteration"] else f"{u['iteration']}-{u['last']}")
                     + f" ({u['ratio']:.2f})" for u in named)
    more = floor.get("outlier_count", len(named)) - len(named)
    return f"; outliers: iterations {text}" + (f" and {more} more" if more > 0 else "")


def floor_short(summary: dict | None) -> str:
    """``; loop/floor 1.08`` for the TTA table's time parts cell where the run measured it, else ``""``."""
    ratio = ((summary or {}).get("floor") or {}).get("loop_over_floor")
    return f"; loop/floor {ratio:.2f}" if ratio is not None else ""
