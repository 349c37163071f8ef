"""``speechperf parallel sweep``: runs of ``speechperf train``, one per algorithm and worker
count (torchrun for several), plus one single-process run: the baseline of the speedups.

Every run is an ordinary training run (train/loop.py, the algorithm a hook of its loop:
speechperf/algorithms), in ``OUT/NAME`` (``one-worker``, ``sync-n2``, ``bmuf-n2-h20``, ...),
its rows in its own database and in the sweep's (``--db``, default ``OUT/results.db``).
The table: speedup of training seconds per epoch over the one worker, the last
validation value of each target metric (speechperf/metric.py), TTA (the preset's
``train.stop.target``, where it sets one), the share of training seconds spent communicating and
MFU. Run again after a failure, the same command reports the finished runs and continues the
unfinished one from its checkpoint (``train --resume auto``).

The speedups measured on this project's CI machine are on 2 CPU cores and say so; the same
command drives GPU machines.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from speechperf.algorithms import periodic
from speechperf.errors import SpeechperfError
from speechperf.results.layout import DB_FILE
from speechperf.studies.speedups import runs_table


@dataclass(frozen=True)
class Sweep:
    """What ``speechperf parallel sweep`` asks for (cli/train_commands.py parses it)."""

    data: str  # prepared features folder
    out: str  # sweep folder: one run folder per algorithm and worker count
    preset: str = "tiny"  # the preset every run trains (or a TOML file)
    algos: str = "sync,bsp,bmuf,diloco"  # algo.name, comma separated
    workers: str = "2"  # worker (process) counts, comma separated
    sync_every: str = "20"  # algo.sync_every of the periodic algorithms, comma separated
    db: str | None = None  # shared results database (None: OUT/results.db)
    overrides: list[str] = field(default_factory=list)  # --set KEY=VALUE of every run, as given


def free_port() -> int:
    """A TCP port nobody uses now, and the next one free too (torchrun's store; the parameter
    server of asgd/easgd takes MASTER_PORT + 1: a port the OS handed out with its neighbour held by
    another process's connection failed a CI run's torchrun with 'Address already in use')."""
    def bindable(port: int) -> bool:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
        return True

    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 65535 and bindable(port + 1):
            return port


def grid(a: Sweep) -> list[tuple[str, int, list[str]]]:
    """(run name, processes, overrides) of every run: the one worker first."""
    runs = [("one-worker", 1, ["algo.name=sync"])]
    for algo in a.algos.split(","):
        for workers in [int(w) for w in a.workers.split(",")]:
            if not periodic(algo):
                runs.append((f"{algo}-n{workers}", workers, [f"algo.name={algo}"]))
                continue
            for every in [int(h) for h in a.sync_every.split(",")]:
                runs.append((f"{algo}-n{workers}-h{every}", workers, [f"algo.name={algo}", f"algo.sync_every={every}"]))
    return runs


def launch(name: str, processes: int, args: list[str]) -> None:
    """``speechperf train ARGS``, under torchrun for several processes; a failure is named with
    the run's own error lines and the note that the same command continues it."""
    train = ["-m", "speechperf", "train", *args]
    cmd = [sys.executable, *train] if processes == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes),
        "--master-port", str(free_port()), *train]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if p.returncode != 0:
        said = [ln for ln in p.stderr.splitlines() if re.search(r"(Error|error:)", ln) and "torch/distributed" not in ln
                and "ChildFailedError" not in ln]
        tail = "\n".join(dict.fromkeys(said[-4:])) or "\n".join(p.stderr.strip().splitlines()[-6:])
        raise SpeechperfError(f"{name} x{processes}: train failed (exit {p.returncode})\n{tail}\n"
                              "the same sweep command continues it from its last checkpoint")


def run_sweep(a: Sweep) -> list[dict]:
    """Train the grid (finished runs are only reported); returns the table's rows."""
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    db = Path(a.db) if a.db else out / DB_FILE
    folders = []
    for name, processes, algo in grid(a):
        folders.append(out / name)
        launch(name, processes, ["--preset", a.preset, "--data", a.data, "--out", str(out / name), "--db", str(db),
                                 "--json", *a.overrides, *algo])
    return runs_table(folders)
