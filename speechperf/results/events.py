"""MLPerf-style event log of a run (``RUN/events.log``), written with mlperf-logging.

Each run gets its own MLLogger bound to a file handler in append mode, so a resumed run
continues the same log and several runs in one process (tests) never mix their lines.
"""
from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from pathlib import Path

from mlperf_logging.mllog import constants, mllog
from speechperf.atomic import DiskFullError, disk_full
from speechperf.errors import MachineFault


class _RaisingFileHandler(logging.FileHandler):
    """A file handler whose failed write raises: logging's default prints the error and goes
    on, which would lose events.log lines silently on a full disk."""

    def handleError(self, record) -> None:  # called inside emit's ``except``
        raise  # noqa: PLE0704 (re-raises the write error being handled)


class EventLog:
    """``start``/``end``/``event`` lines in the ``:::MLLOG {json}`` format."""

    def __init__(self, path: Path, run_id: str, enabled: bool = True):
        self.logger = logging.getLogger(f"speechperf.mllog.{run_id}")
        self.logger.propagate = False
        self.logger.setLevel(logging.INFO)
        self.handler = None
        if enabled:
            self.handler = _RaisingFileHandler(path, mode="a", encoding="utf-8")
            self.logger.addHandler(self.handler)
        else:
            self.logger.addHandler(logging.NullHandler())
        self.ml = mllog.MLLogger(logger=self.logger, default_stack_offset=2)
        self.path = Path(path)

    @contextmanager
    def _writing(self):
        """A failed write names the log (a full disk: DiskFullError)."""
        try:
            yield
        except OSError as e:
            if disk_full(e, self.path.parent):
                raise DiskFullError.writing(self.path) from e
            raise MachineFault(f"{self.path} cannot be written ({e.strerror or e})") from e

    def event(self, key: str, value=None, time_ms: int | None = None, **metadata) -> None:
        with self._writing():
            self.ml.event(key=key, value=value, metadata=metadata or None, time_ms=time_ms)

    def start(self, key: str, value=None, time_ms: int | None = None, **metadata) -> None:
        with self._writing():
            self.ml.start(key=key, value=value, metadata=metadata or None, time_ms=time_ms)

    def end(self, key: str, value=None, time_ms: int | None = None, **metadata) -> None:
        with self._writing():
            self.ml.end(key=key, value=value, metadata=metadata or None, time_ms=time_ms)

    def close(self) -> None:
        if self.handler is not None:
            self.handler.close()
            self.logger.removeHandler(self.handler)
            self.handler = None


C = constants  # re-exported keys: C.RUN_START, C.RUN_STOP, C.EVAL_ACCURACY, ...


def read_events(path: Path) -> list[dict]:
    """Parse an events.log back into dicts (for tests, resume checks and the report)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith(":::MLLOG "):
            out.append(json.loads(line[len(":::MLLOG "):]))
    return out
