"""The run folder's file names: the one place each is spelled.

Every other module names a run folder's files through these constants (results/formats.py
reads the JSON files, results/view.py and results/run.py open the rest, results/checkpoint.py
writes the checkpoint, the commands that point at one file of a run use :func:`events_log`),
so that a file renamed here is renamed everywhere.
"""
from __future__ import annotations

from pathlib import Path

RUN_FILE = "run.json"  # format, run id, kind, label, host, where the features were
CONFIG_FILE = "config.json"  # the RunConfig, as a dict
ENV_FILE = "env.json"  # the machine: capture_env plus world_size, platform, precision_note
DB_FILE = "results.db"  # the run's own rows (results/schema.py)
EVENTS_FILE = "events.log"  # MLPerf-style event log, append-only
SENTENCES_FILE = "sentences.jsonl"  # logged hypotheses beside references, append-only
CHECKPOINT_FILE = "checkpoint.pt"  # results/checkpoint.py
SUMMARY_FILE = "summary.json"  # written last: its presence means the run finished
APPEND_LOGS = (EVENTS_FILE, SENTENCES_FILE)  # cut back to the checkpoint's sizes on resume
JSON_FILES = (CONFIG_FILE, ENV_FILE, SUMMARY_FILE)  # besides run.json: read (and checked) through read_json


def events_log(path: Path) -> Path:
    """A run folder's events.log, or ``path`` itself where it names a file (``check-log RUN``
    takes either)."""
    path = Path(path)
    return path / EVENTS_FILE if path.is_dir() else path


def has_checkpoint(folder: Path) -> bool:
    """Whether the run folder holds a checkpoint (without reading it: no torch)."""
    return (Path(folder) / CHECKPOINT_FILE).is_file()


def is_run(folder: Path) -> bool:
    """Whether ``folder`` holds a run (its run.json, written last by ``Run.create``)."""
    return (Path(folder) / RUN_FILE).is_file()
