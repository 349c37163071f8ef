"""MLPerf-style event log of a run (``RUN/events.log``), written with mlperf-logging.

Each run gets its own MLLogger bound to a file handler in append mode, so a resumed run
continues the same log and several runs in one process (tests) never mix their lines.
"""
from __future__ import annotations

import logging
from pathlib import Path

from mlperf_logging.mllog import constants, mllog


class EventLog:
    """``start``/``end``/``event`` lines in the ``:::MLLOG {json}`` format."""

    def __init__(self, path: Path, run_id: str, enabled: bool = True):
        self.logger = logging.getLogger(f"speechperf.mllog.{run_id}")
        self.logger.propagate = False
        self.logger.setLevel(logging.INFO)
        self.handler = None
        if enabled:
            self.handler = logging.FileHandler(path, mode="a", encoding="utf-8")
            self.logger.addHandler(self.handler)
        else:
            self.logger.addHandler(logging.NullHandler())
        self.ml = mllog.MLLogger(logger=self.logger, default_stack_offset=2)

    def event(self, key: str, value=None, time_ms: int | None = None, **metadata) -> None:
        self.ml.event(key=key, value=value, metadata=metadata or None, time_ms=time_ms)

    def start(self, key: str, value=None, time_ms: int | None = None, **metadata) -> None:
        self.ml.start(key=key, value=value, metadata=metadata or None, time_ms=time_ms)

    def end(self, key: str, value=None, time_ms: int | None = None, **metadata) -> None:
        self.ml.end(key=key, value=value, metadata=metadata or None, time_ms=time_ms)

    def close(self) -> None:
        if self.handler is not None:
            self.handler.close()
            self.logger.removeHandler(self.handler)
            self.handler = None


C = constants  # re-exported keys: C.RUN_START, C.RUN_STOP, C.EVAL_ACCURACY, ...


def read_events(path: Path) -> list[dict]:
    """Parse an events.log back into dicts (for tests, resume checks and the report)."""
    import json

    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith(":::MLLOG "):
            out.append(json.loads(line[len(":::MLLOG "):]))
    return out
