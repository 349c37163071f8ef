"""The ledger of measured figures, benchmarks/ledger.jsonl: one JSON object a line, appended.

Each line: {"date", "commit", "machine", "command", "benchmark", "figures": {...}}. The docs cite a
figure's latest line by its benchmark's name. A line is written with one ``write`` on a file
opened for appending and then fsynced, so lines from processes appending at once never
interleave and a crash leaves every earlier line whole.
"""
from __future__ import annotations

import datetime
import json
import os
import subprocess
from pathlib import Path

LEDGER = Path(__file__).resolve().parent / "ledger.jsonl"
KEYS = ("date", "commit", "machine", "command", "benchmark", "figures")


def commit(repo: Path = LEDGER.parent) -> str | None:
    """``git rev-parse --short HEAD`` of the checkout measured (None outside a git checkout)."""
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def entry(benchmark: str, command: str, figures: dict, machine: str) -> dict:
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "commit": commit(), "machine": machine, "command": command, "benchmark": benchmark,
            "figures": figures}


def append(line: dict, path: Path = LEDGER) -> None:
    """Append ``line`` (every key of KEYS) to ``path`` as one JSON line, atomically."""
    missing = [k for k in KEYS if k not in line]
    if missing:
        raise ValueError(f"ledger line lacks {', '.join(missing)}")
    data = (json.dumps(line, sort_keys=False, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        if os.write(fd, data) != len(data):  # one write: O_APPEND puts it whole at the end
            raise OSError(f"{path}: short write to the ledger")
        os.fsync(fd)
    finally:
        os.close(fd)


def read(path: Path = LEDGER) -> list[dict]:
    """Every line of the ledger, oldest first (an empty list where there is none)."""
    if not path.is_file():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def latest(benchmark: str, path: Path = LEDGER) -> dict | None:
    """The last line of ``benchmark``, the figure the docs cite."""
    return next((e for e in reversed(read(path)) if e["benchmark"] == benchmark), None)
