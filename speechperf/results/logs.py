"""A run's append-only logs: ``events.log`` (MLPerf style, results/events.py) and
``sentences.jsonl`` (logged hypotheses beside their references).

:class:`LogReader` reads them and never creates one; :class:`RunLog` is the writer's, which
appends to them and, on resume, cuts them back to the byte sizes its checkpoint recorded, so
that no line is doubled.
"""
from __future__ import annotations

import json
from pathlib import Path

from speechperf.results.formats import RunError
from speechperf.results.layout import APPEND_LOGS, EVENTS_FILE, SENTENCES_FILE

SENTENCES_SHOWN = 3  # last logged sentence batches a reader gets


class LogReader:
    """The logs of the run folder ``folder``, read-only."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def sentences(self, last: int = SENTENCES_SHOWN) -> list[dict]:
        path = self.folder / SENTENCES_FILE
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines()[-last:]:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a run killed mid-write leaves half a line: skip it
                continue
            except ValueError as e:  # an integer of more digits than Python converts: no line speechperf writes
                raise RunError(f"{path}: a line is not readable as JSON ({e}); the run folder is damaged") from None
        return out

    def done(self) -> tuple[int, int]:
        """(iteration of the last checkpoint written, per-epoch evaluations logged), as events.log
        says (0, 0 where it says nothing): what a killed run's database must hold at least."""
        path, iteration, epochs = self.folder / EVENTS_FILE, 0, set()
        if not path.exists():
            return 0, 0
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if not line.startswith(":::MLLOG "):
                continue
            try:
                e = json.loads(line[len(":::MLLOG "):])
                meta = e.get("metadata") or {}
                if e.get("key") == "checkpoint_written" and isinstance(meta.get("iteration"), int):
                    iteration = max(iteration, meta["iteration"])
                elif e.get("key") == "eval_accuracy" and isinstance(meta.get("epoch_num"), int):
                    epochs.add(meta["epoch_num"])
            except (ValueError, AttributeError):  # a line cut by a kill, or not MLPerf's shape: says nothing
                continue
        return iteration, len(epochs)

    def log_sizes(self) -> dict:
        """Each append-only log's byte size (a checkpoint records them: :meth:`RunLog.truncate_logs`)."""
        return {n: (self.folder / n).stat().st_size for n in APPEND_LOGS if (self.folder / n).exists()}


class RunLog(LogReader):
    """The writer's logs of run ``run_id``: the event log opened once, in append mode."""

    def __init__(self, folder: Path, run_id: str):
        super().__init__(folder)
        self.run_id = run_id
        self._events = None

    def events(self):
        """The MLPerf event log (append mode), opened once."""
        if self._events is None:
            from speechperf.results.events import EventLog  # mlperf-logging: loaded by writers only

            self._events = EventLog(self.folder / EVENTS_FILE, self.run_id)
        return self._events

    def append_sentences(self, record: dict) -> None:
        with open(self.folder / SENTENCES_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def truncate_logs(self, sizes: dict) -> None:
        """On resume, cut the append-only logs back to the checkpoint so that no line is doubled."""
        for name in APPEND_LOGS:
            path = self.folder / name
            size = sizes.get(name, 0)
            if path.exists() and path.stat().st_size > size:
                with open(path, "r+b") as f:
                    f.truncate(size)

    def close(self) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None
