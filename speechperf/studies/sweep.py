"""``speechperf parallel sweep``: runs of ``speechperf train``, one per algorithm and worker
count (torchrun for several), plus one single-process run: the baseline of the speedups.

Every run is an ordinary training run (train/loop.py, the algorithm a hook of its loop:
speechperf/algorithms), in ``OUT/NAME`` (``one-worker``, ``sync-n2``, ``bmuf-n2-h20``, ...),
its rows in its own database and in the sweep's (``--db``, default ``OUT/results.db``).
The table: speedup of training seconds per epoch over the one worker, the last
validation value of each target metric (speechperf/metric.py), TTA (the preset's
``train.target``, where it sets one), the share of training seconds spent communicating and
MFU. Run again after a failure, the same command reports the finished runs and continues the
unfinished one from its checkpoint (``train --resume auto``).

The speedups measured on this project's CI machine are on 2 CPU cores and say so; the same
command drives GPU machines.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from speechperf.algorithms import periodic
from speechperf.errors import SpeechperfError
from speechperf.config.training import target_rule
from speechperf.metric import per_epoch
from speechperf.scoring.target_rule import tta_minutes
from speechperf.results.layout import DB_FILE
from speechperf.results.run import Run
from speechperf.results.workload import workload_label
from speechperf.telemetry.machine import devices

ONE_PROCESS = ("single", "sync")  # algo.name of an ordinary run (sync on one process is a plain run)


def parse(argv: list[str]) -> argparse.Namespace:
    return parser().parse_args(argv)


def parser(add_help: bool = True) -> argparse.ArgumentParser:
    """The sweep's options (also those of ``speechperf parallel sweep``)."""
    p = argparse.ArgumentParser(prog="speechperf parallel sweep", add_help=add_help,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", required=True, help="prepared features folder")
    p.add_argument("--out", required=True, help="sweep folder (one run folder per algorithm and worker count)")
    p.add_argument("--preset", default="tiny", help="the preset every run trains (or a TOML file)")
    p.add_argument("--algos", default="sync,bsp,bmuf,diloco", help="algorithms (algo.name), comma separated")
    p.add_argument("--workers", default="2", help="worker (process) counts, comma separated")
    p.add_argument("--sync-every", default="20", help="algo.sync_every of bsp, bmuf and diloco, comma separated")
    p.add_argument("--db", default=None, help="shared results database (default: OUT/results.db)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an override of every run (repeat it: --set max_epochs=3 --set threads=1)")
    return p


def free_port() -> int:
    """A TCP port nobody uses now, and the next one free too (torchrun's store; the parameter
    server of asgd/easgd takes MASTER_PORT + 1: a port the OS handed out with its neighbour held by
    another process's connection failed a CI run's torchrun with 'Address already in use')."""
    import socket

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


def grid(a: argparse.Namespace) -> list[tuple[str, int, list[str]]]:
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


def run_sweep(argv: list[str], as_json: bool = False) -> list[dict]:
    """Train the grid (finished runs are only reported); returns the table's rows."""
    a = parse(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    db = Path(a.db) if a.db else out / DB_FILE
    folders = []
    for name, processes, algo in grid(a):
        folders.append(out / name)
        launch(name, processes, ["--preset", a.preset, "--data", a.data, "--out", str(out / name), "--db", str(db),
                                 "--json", *a.set, *algo])
    return runs_table(folders)


def runs_table(folders: list[Path]) -> list[dict]:
    """One row per run folder; speedups against the first (the one worker)."""
    facts = [_facts(f) for f in folders]
    base = facts[0]["train_s_per_epoch"]
    return [_row(f, base) for f in facts]


def report_rows(runs: list[dict]) -> list[dict]:
    """The sweep's table of a report's runs (``report.runs.load_run`` dicts): one row per run of
    every workload and machine that has a run of another algorithm or worker count than one
    process; the speedups against the first one-process run of the same workload on the same
    machine (None where there is none: a speedup across machines would measure the machines)."""
    groups: dict[tuple, list] = {}
    for r in runs:
        groups.setdefault((workload_label(r["workload"]), devices(r["env"])[1]), []).append(r)
    rows = []
    for (work, machine), group in groups.items():
        facts = [run_facts(r["summary"], r["config"], r["env"], r["iterations"], r["evals"], r["label"]) for r in group]
        if all(f["workers"] == 1 and f["algo"] in ONE_PROCESS for f in facts):
            continue  # nothing parallel to compare in this workload on this machine
        base = next((f["train_s_per_epoch"] for f in facts if f["workers"] == 1), None)
        rows += [{"workload": work, "machine": machine, **_row(f, base)} for f in facts]
    return rows


def _facts(folder: Path) -> dict:
    run = Run.open(folder)
    try:
        return run_facts(run.summary() or {}, run.config, run.env, run.iterations(), run.evals(), folder.name)
    finally:
        run.close()


def run_facts(summary: dict, config: dict, env: dict, its: list[dict], evals: list[dict], name: str) -> dict:
    """What the sweep's table says of one run, from its recorded rows (nothing recomputed but
    sums): training seconds per epoch, the last value of each target metric, TTA to the run's
    own target on the run's clock, the share of training seconds spent communicating and bytes
    sent per step."""
    train_s = sum(r["step_s"] for r in its)
    comm_s = sum(r.get("comm_s") or 0.0 for r in its)
    comm_bytes = sum(r.get("comm_bytes") or 0 for r in its)
    tc, algo = config.get("train", {}), config.get("algo", {})
    metric, target, window = target_rule(tc)
    tta = tta_minutes([(e["clock_s"], e[metric]) for e in evals], target, window) if target > 0 else None
    epochs = max(summary.get("epochs") or 0, 1)
    return {"algo": algo.get("name", "sync"), "workers": env.get("world_size") or 1,
            "sync_every": algo.get("sync_every") if periodic(algo.get("name", "sync")) else None,
            "epochs": summary.get("epochs"), "train_s_per_epoch": train_s / epochs,
            **{m.name: summary.get(f"last_{m.name}") for m in per_epoch()}, "tta_min": tta,
            "comm_pct": 100 * comm_s / train_s if train_s else None,
            "comm_mb_per_step": comm_bytes / len(its) / 1e6 if its else None, "mfu_pct": summary.get("mfu_pct"),
            "status": summary.get("status"), "run": name}


def _row(f: dict, base: float | None) -> dict:
    return {"algorithm": f["algo"], "workers": f["workers"], "sync every": f["sync_every"], "epochs": f["epochs"],
            "train s/epoch": f["train_s_per_epoch"],
            "speedup": base / f["train_s_per_epoch"] if base and f["train_s_per_epoch"] else None,
            **{m.label: f.get(m.name) for m in per_epoch()}, "TTA min": f["tta_min"], "comm %": f["comm_pct"],
            "comm MB/step": f["comm_mb_per_step"], "MFU %": f["mfu_pct"], "status": f["status"], "run": f["run"]}
