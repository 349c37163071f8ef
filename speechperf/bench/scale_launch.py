"""``speechperf bench scale --world N`` on one node: the rows at one device, then the same rows at N
devices (N torchrun ranks, each stepping its own batches through the sharded loop's model:
bench/scale.py), and each N-device row's scaling efficiency against the one-device row:

    efficiency = audio s/s at N devices / (N x audio s/s at one device)

A device is a GPU (``cuda``: rank r on GPU r) or, on a CPU, a share of its cores: the N ranks
take cores / N threads each and the one-device row is measured at that share too, so the
efficiency is that of N slices of the CPU (what sharding and its collectives cost), not of the
whole CPU against a part. A row that does not fit one device has no efficiency (said in its
status). Under torchrun (several nodes: ``torchrun --nnodes M --nproc-per-node G -m speechperf bench
scale --world M*G --baseline ONE.json``) each process is a rank of the N-device rows and nothing is
started here; their efficiency is against the one-device rows saved in ONE.json (``--json`` of a run
at one device of the same kind).
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import torch

from speechperf.bench.scale import Request, run_scale
from speechperf.children import dies_with
from speechperf.errors import SpeechperfError
from speechperf.train.distributed import DistEnv


def measure(req: Request, progress: bool = True, refuse_unfit: bool = True, baseline: Path | None = None) -> list[dict]:
    """The rows of ``req``: one device's; under torchrun this rank's share of N devices' (rank 0 gets
    the rows, the other ranks none); else, for N > 1, one device's and N's, each measured in a
    process of its own (what one row allocates goes back to the system before the next starts); a
    model that fits N devices but not one has N-device rows without an efficiency. ``baseline``: a
    saved ``bench scale --json`` whose one-device rows the N-device rows are compared with instead
    of measuring them here (several nodes under torchrun: the only way to an efficiency)."""
    env = DistEnv.from_env()
    if baseline is not None and req.world == 1:
        raise SpeechperfError(f"--baseline {baseline}: the one-device rows N devices are compared with; this "
                              "command measures one device (--world 1)")
    ones = [r for r in read_rows(baseline) if r.get("world", 1) == 1] if baseline is not None else None
    if req.world == 1 or env.world > 1:
        rows = run_scale(req, progress, refuse_unfit)
        if env.rank:  # rank 0 prints the rows
            return []
        return rows if ones is None else _beside(efficiencies(rows, ones), ones, baseline)
    threads = max(1, torch.get_num_threads() // req.world)  # a rank's share of the host (its device's, on a CPU)
    if ones is not None:
        return _beside(efficiencies(child(req, threads), ones), ones, baseline)
    ones = child(replace(req, world=1), threads, refuse_unfit=False)
    return ones + efficiencies(child(req, threads), ones)


def child(req: Request, threads: int, refuse_unfit: bool = True) -> list[dict]:
    """``req``'s rows measured by a child process (N > 1: torchrun's N ranks on this node), ``threads``
    each; the rows its rank 0 printed. The children die with this process (``children.dies_with``)."""
    args = ["--workloads", ",".join(req.workloads), "--steps", str(req.steps), "--warmup", str(req.warmup),
            "--device", req.device, "--world", str(req.world), "--json"]
    args += ["--batch-seconds", ",".join(f"{s:g}" for s in req.batch_seconds)] if req.batch_seconds else []
    args += ["--precision", req.precision] if req.precision else []
    args += ["--memory-limit-gb", f"{req.memory_limit_gb:g}"] if req.memory_limit_gb is not None else []
    args += [] if req.measure_memory else ["--no-memory"]
    args += [] if refuse_unfit else ["--rows-if-none-fit"]
    ranks = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(req.world)]
    launch = ranks if req.world > 1 else []
    cmd = [sys.executable, *launch, "-m", "speechperf", "bench", "scale", *args, *req.overrides]
    p = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=dies_with(os.getpid()),
                       env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    out = p.stdout[p.stdout.find("\n[") + 1:] if not p.stdout.startswith("[") else p.stdout  # rank 0's JSON
    if p.returncode not in (0, 1) or not out.startswith("["):  # 1: no row measured, each says why
        tail = "\n".join(dict.fromkeys(_said(p.stderr)[-4:])) or "\n".join(p.stderr.strip().splitlines()[-6:])
        killed = p.returncode == -9 or "(exitcode: -9)" in p.stderr
        raise SpeechperfError(f"bench scale at {req.world} device(s): its process failed (exit {p.returncode})\n"
                              f"{tail}" + (MALLOC_HINT if killed and req.device == "cpu" else ""))
    return json.loads(out)


MALLOC_HINT = ("\non a CPU host glibc's heap keeps freed blocks of up to 32 MB, so a process can hold more than its "
               "peak: MALLOC_MMAP_THRESHOLD_=1048576 MALLOC_TRIM_THRESHOLD_=1048576 return them (docs/parallel.md)")


def _said(stderr: str) -> list[str]:
    """The lines of a child's stderr that name why it failed: its own error line, a rank's exception,
    torchrun's line for a rank killed by a signal (exitcode -9: the kernel's OOM killer, say)."""
    keep = re.compile(r"speechperf: error:|^\[rank\d+\]: \w*(Error|Exception)\b|failed \(exitcode: -?\d+\)")
    lines = [re.sub(r"^.*?(failed \(exitcode)", r"a rank \1", ln) for ln in stderr.splitlines() if keep.search(ln)]
    return [ln + (" (SIGKILL: out of memory?)" if "(exitcode: -9)" in ln else "") for ln in lines]


def _beside(sharded: list[dict], ones: list[dict], baseline: Path) -> list[dict]:
    """The baseline's one-device rows that ``sharded`` rows were compared with, first (``source`` says
    where from), then the sharded rows: one output that ``cost`` reads whole, as after one node's run."""
    used = {_like(r) for r in sharded if r.get("scaling_efficiency") is not None}
    return [{**r, "source": str(baseline)} for r in ones if r["status"] == "ok" and _like(r) in used] + sharded


def _like(row: dict) -> tuple:
    """What a one-device row must share with an N-device row to be its baseline."""
    return row["workload"], row.get("batch_s"), row.get("precision"), str(row.get("device", "")).split(":")[0]


def read_rows(path: Path) -> list[dict]:
    """A saved ``bench scale --json`` output's rows, checked (data only: JSON, nothing executed): a
    list of objects, each with a workload and a status, its rates positive numbers where given."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise SpeechperfError(f"{path}: not a bench scale --json output ({type(e).__name__}: {e})") from e
    if not isinstance(data, list) or not data or not all(isinstance(r, dict) for r in data):
        raise SpeechperfError(f"{path}: not a bench scale --json output (a list of rows, one object per workload)")
    for i, r in enumerate(data):
        if not isinstance(r.get("workload"), str) or not isinstance(r.get("status"), str):
            raise SpeechperfError(f"{path}: row {i} has no workload or status: not a bench scale --json output")
        for k in RATES:
            if r.get(k) is not None and not (is_number(r[k]) and r[k] > 0):
                raise SpeechperfError(f"{path}: row {i} ({r['workload']}): {k}={r[k]!r} is not a positive number")
    return data


RATES = ("audio_s_per_s", "audio_s_per_s_min", "audio_s_per_s_median", "audio_s_per_s_max", "power_w", "step_s",
         "scaling_efficiency")  # checked where a saved row holds them


def is_number(v) -> bool:
    """A finite int or float, not a bool (JSON's true is no rate)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def efficiencies(sharded: list[dict], ones: list[dict]) -> list[dict]:
    """``sharded`` rows with ``scaling_efficiency`` against the one-device row of the same workload,
    batch, precision and kind of device (None where there is no such row: it did not run or fit)."""
    one = {_like(r): r for r in ones if r["status"] == "ok"}
    out = []
    for r in sharded:
        base = one.get(_like(r))
        ok = base is not None and r["status"] == "ok" and base["audio_s_per_s"]
        out.append({**r, "scaling_efficiency": r["audio_s_per_s"] / (r["world"] * base["audio_s_per_s"]) if ok
                    else None})
    return out
