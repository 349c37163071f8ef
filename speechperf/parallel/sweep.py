"""``speechperf parallel sweep``: algorithms x workers x sync periods x batch sizes, each a
torchrun job, all from one shared starting model (one epoch of single-worker SGD, trained
once and reused), then the paper-003 tables: speedup against one worker with the same
batch size, WER on test-clean / test-other, communication per synchronization.

Run again after a failure, the same command keeps the runs that finished and resumes the
failed one from its checkpoint (``RUN/checkpoint.pt``, written after every epoch).

The same command drives a GPU cluster; on this project's CI machine the speedups are
measured on 2 CPU cores and are labelled so.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from speechperf.errors import SpeechperfError


def parse(argv: list[str]) -> argparse.Namespace:
    return parser().parse_args(argv)


def parser(add_help: bool = True) -> argparse.ArgumentParser:
    """The sweep's options (also those of ``speechperf parallel sweep``)."""
    p = argparse.ArgumentParser(prog="speechperf parallel sweep", add_help=add_help,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", required=True, help="prepared features folder")
    p.add_argument("--out", required=True, help="sweep folder (one run folder per grid point)")
    p.add_argument("--algos", default="sync,bsp,bmuf", help="algorithms, comma separated")
    p.add_argument("--workers", default="2", help="worker counts, comma separated")
    p.add_argument("--sync-periods", default="1,5", help="sync periods (tau), comma separated")
    p.add_argument("--batch-sizes", default="8", help="utterances per worker per step, comma separated")
    p.add_argument("--epochs", type=int, default=3, help="at most this many epochs per run")
    p.add_argument("--model", default="dnn", help="a registered model (dnn, cldnn, ds2, ...) or a preset name")
    p.add_argument("--hidden", type=int, default=None, help="override hidden width (dnn/cldnn)")
    p.add_argument("--lr", type=float, default=0.2, help="learning rate")
    p.add_argument("--momentum", type=float, default=0.0, help="local SGD momentum of every worker (paper: 0)")
    p.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd", help="every worker's local optimizer")
    p.add_argument("--db", default=None, help="shared results database (default: OUT/results.db)")
    return p


def free_port() -> int:
    """A TCP port nobody listens on now (torchrun's store; the rpc store takes the next one)."""
    import socket

    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 65535:
            return port


def _launch(common: list[str], algo: str, workers: int, extra: list[str], out: Path, port: int | None = None) -> None:
    from speechperf.parallel.worker import finished_run, resume_note

    argv = ["--algo", algo, "--out", str(out), *common, *extra]
    if finished_run(out, argv, workers):  # the same sweep again continues where it failed
        return
    port = port or free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(workers), "--master-port", str(port),
           "-m", "speechperf.parallel", *argv]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if p.returncode != 0:
        # torchrun names the first failure under "Root Cause"; the other ranks fail after it
        root = p.stderr.split("Root Cause", 1)[-1]
        ranks = sorted(set(re.findall(r"rank\s*:\s*(\d+)", root)))
        who = f"worker rank {', '.join(ranks)} failed first" if ranks else "a worker failed"
        # the workers' own error lines, not torchrun's summary
        said = [ln for ln in p.stderr.splitlines() if re.search(r"(Error|error:)", ln) and "torch/distributed" not in ln
                and "ChildFailedError" not in ln]
        tail = "\n".join(dict.fromkeys(said[-4:])) or "\n".join(p.stderr.strip().splitlines()[-6:])
        note = resume_note(out, argv, workers)  # the epochs done are not lost: say how to continue
        raise SpeechperfError(f"{algo} x{workers} ({out}): {who} (exit {p.returncode})\n{tail}"
                              + (f"\n{note}" if note else ""))


def run_sweep(argv: list[str], as_json: bool = False) -> list[dict]:
    """Run the grid; returns one row per run with its speedup against one worker."""
    from speechperf.results import ResultsDB

    a = parse(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    db = Path(a.db) if a.db else out / "results.db"
    common = ["--data", a.data, "--model", a.model, "--epochs", str(a.epochs), "--lr", str(a.lr),
              "--momentum", str(a.momentum), "--optimizer", a.optimizer, "--db", str(db)]
    if a.hidden:
        common += ["--hidden", str(a.hidden)]
    init = out / "init.pt"
    if not init.exists():  # the shared start: one epoch of single-worker SGD
        _launch([c if c != str(a.epochs) else "1" for c in common], "single", 1, ["--save-init", str(init)],
                out / "init")
    for batch in [int(b) for b in a.batch_sizes.split(",")]:
        _launch(common, "single", 1, ["--init", str(init), "--batch-size", str(batch)], out / f"single-b{batch}")
        for algo in a.algos.split(","):
            periods = [1] if algo == "sync" else [int(t) for t in a.sync_periods.split(",")]
            for workers in [int(w) for w in a.workers.split(",")]:
                for tau in periods:
                    name = f"{algo}-n{workers}-tau{tau}-b{batch}"
                    _launch(common, algo, workers, ["--init", str(init), "--batch-size", str(batch),
                                                    "--sync-period", str(tau)], out / name)
    with ResultsDB(db, readonly=True) as conn:  # every run of the grid wrote its rows here too
        rows = conn.query("SELECT * FROM parallel_runs WHERE model = ? ORDER BY batch, algo, workers, sync_period",
                          [a.model])
    return table(rows)


def shared_start(row: dict) -> bool:
    """True for the run that made the shared starting model (it ran with ``--save-init``): one
    epoch at the default batch, no configuration of the grid, so no row of the tables."""
    return bool(row.get("shared_start"))


def table(rows: list[dict]) -> list[dict]:
    """Tables 1-5 form: speedup of epoch time against the single worker with the same batch."""
    rows = [r for r in rows if not shared_start(r)]
    single = {r["batch"]: r["s_per_epoch"] for r in rows if r["algo"] == "single" and r["epochs"]}
    out = []
    for r in rows:
        base = single.get(r["batch"])
        out.append({"algo": r["algo"], "workers": r["workers"], "tau": r["sync_period"], "batch": r["batch"],
                    "epochs": r["epochs"], "s/epoch": r["s_per_epoch"],
                    "speedup (2 CPU cores)": base / r["s_per_epoch"] if base and r["s_per_epoch"] else None,
                    "comm s/sync": r["comm_s"] / r["syncs"] if r["syncs"] else None,
                    "MB/sync": r["comm_bytes"] / r["syncs"] / 1e6 if r["syncs"] else None,
                    "cv_loss": r["cv_loss"], "WER test-clean": r["wer_test_clean"],
                    "WER test-other": r["wer_test_other"]})
    return out
