"""How busy the accelerator was while a run's time to accuracy ran: the mean utilization of its
recorded samples over the TTA window, inside its training phases and inside its evaluations,
each with its sample count, so that a reader of studies/time_parts.py's seconds also sees
whether the device was working in them.

The phases come from the run's rows, on the TTA clock as its samples are (results/schema.py:
a stored sample's ``t`` is on the clock, a resumed run's later processes continuing it, the
time kept off the clock dropped): an epoch's training phase runs from the start of its first
iteration row's window (``clock_s - step_s``) to the start of its evaluation (``clock_s -
eval_s``), or to its last row where no evaluation of it came before the TTA moment; an
evaluation is its row's window. A utilization sample reports the period that ends at its time,
so a window ``(start, end]`` holds the samples stamped after its start up to its end. The
samples come at a steady period (the driver's, or the sampler's), so their mean is the time's.

GPU runs: ``util_pct``: NVML's (the share of the driver's sample period in which a kernel ran)
or, on AMD GPUs, amdsmi's ``gfx_activity`` (the graphics engine's busy share, polled),
of the GPUs the sampler read (rank 0's: those of its node that the run used, picked by UUID,
telemetry/device_gpus.py; every GPU of the node in runs recorded before that, or where they
could not be matched, as the summary's ``sampled_gpus`` says), the sources averaged sample by
sample. CPU runs: ``util_machine_pct``, the CPU seconds of rank 0's process and its loader
workers per wall second in % of all the machine's cores: on a CPU run the cores are the
accelerator, so its busy share is shown the same way and named as the CPU's. It counts a
thread spinning in a parallel region as busy, where NVML counts a kernel running however few
of its units it fills: both say when the device had work, not how well it used it. A GPU run
without GPU utilization samples has no busy share (None, and said): the CPU's is not the
GPU's.
"""
from __future__ import annotations

GPU, CPU = ("GPU", "util_pct"), ("CPU", "util_machine_pct")  # (device named, sample metric)
PHASES = ("tta", "training", "eval")
EPS = 1e-6  # rows at the TTA moment, read back from the database's floats


def phases(iterations: list[dict], evals: list[dict], until_s: float) -> dict[str, list[tuple[float, float]]]:
    """{phase: [(start, end), ...]} on the TTA clock up to ``until_s``: the TTA window, each
    epoch's training phase and each evaluation's window (the rows at or before ``until_s``)."""
    evs = [e for e in evals if e["clock_s"] <= until_s + EPS]
    starts: dict[int, float] = {}
    last: dict[int, float] = {}
    for r in iterations:
        if r["clock_s"] <= until_s + EPS:
            starts[r["epoch"]] = min(starts.get(r["epoch"], r["clock_s"]), r["clock_s"] - r["step_s"])
            last[r["epoch"]] = max(last.get(r["epoch"], r["clock_s"]), r["clock_s"])
    evaluated = {e["epoch"]: e["clock_s"] - e["eval_s"] for e in evs}
    training = [(start, evaluated.get(epoch, last[epoch])) for epoch, start in sorted(starts.items())]
    return {"tta": [(0.0, until_s)], "training": training,
            "eval": [(e["clock_s"] - e["eval_s"], e["clock_s"]) for e in evs]}


def device_of(samples: list[dict], device: str | None) -> tuple[tuple[str, str] | None, str | None]:
    """((device named, metric), None) of the samples a run's busy share reads, or (None, why
    there is none). ``device``: the run's recorded device (env.json ``device``; a CPU run on a
    machine with GPUs samples them too, idle: its share is the CPU's); a run that recorded none
    reads its GPUs' where it sampled any."""
    metrics = {s["metric"] for s in samples}
    gpu_run = str(device).startswith("cuda") if device else GPU[1] in metrics
    wanted = GPU if gpu_run else CPU
    if wanted[1] in metrics:
        return wanted, None
    return None, "no GPU utilization samples (NVML or amdsmi)" if gpu_run else "no CPU utilization samples"


def busy(samples: list[dict], iterations: list[dict], evals: list[dict], until_s: float,
         device: str | None) -> dict:
    """The busy share of a run's accelerator up to ``until_s``: ``{"device", "metric",
    "sources", "tta %", "tta samples", "training %", ..., "eval samples", "note"}``; a phase
    holding no sample has None for its %, and with no utilization sample at all every % is None
    and ``note`` says why."""
    chosen, why = device_of(samples, device)
    out = {"device": chosen[0] if chosen else None, "metric": chosen[1] if chosen else None, "sources": []}
    for name in PHASES:
        out[f"{name} %"], out[f"{name} samples"] = None, 0
    if chosen is None:
        return {**out, "note": why}
    series = sorted((s["t"], s["value"], s["source"]) for s in samples if s["metric"] == chosen[1])
    out["sources"] = sorted({src for _, _, src in series})
    for name, windows in phases(iterations, evals, until_s).items():
        inside = [v for t, v, _ in series if any(start < t <= end + EPS for start, end in windows)]
        out[f"{name} %"] = sum(inside) / len(inside) if inside else None
        out[f"{name} samples"] = len(inside)
    empty = [name for name in PHASES if not out[f"{name} samples"]]
    note = [f"no sample inside {', '.join(empty)}"] if empty else []
    if len(out["sources"]) > 1:
        note.append(f"averaged over {', '.join(out['sources'])}: the GPUs the sampler read")
    return {**out, "note": "; ".join(note) or None}


def _pct(x: float | None) -> str:
    return "NA" if x is None else f"{x:.0f}%"


def busy_text(b: dict) -> str:
    """``GPU busy 33% (training 61% eval 5%; 444 samples)``: the table's short form."""
    if b["device"] is None:
        return f"busy: {b['note']}"
    return (f"{b['device']} busy {_pct(b['tta %'])} (training {_pct(b['training %'])} eval {_pct(b['eval %'])}; "
            f"{b['tta samples']} samples)")
