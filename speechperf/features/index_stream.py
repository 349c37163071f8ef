"""``SPLIT/index.json`` written from the shards' sidecars, one shard at a time.

The index of LibriSpeech's 960 h holds 281,241 records (~100 MB of JSON, ~300 MB as
Python objects); building it as one object made ``prepare``'s memory grow with the corpus.
Here each sidecar is read, its records written out and dropped: memory is bounded by one
shard plus the split's shard names, problems and feature sums. The bytes are exactly those
of ``json.dumps(index, indent=1)`` (tests/features/test_prepare_kill.py compares them), so
folders prepared before and after this change read alike and compare equal.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from speechperf.atomic import atomic_write
from speechperf.features.shards import shard_name


class _Totals:
    """What the split's summary and the statistics need, accumulated shard by shard."""

    def __init__(self):
        self.kept, self.seconds = 0, 0.0
        self.shards: dict[str, str] = {}
        self.problems: list[dict] = []
        self.n, self.sum, self.sumsq = 0, None, None

    def add(self, meta: dict) -> None:
        self.kept += len(meta["records"])
        self.seconds += sum(r["duration"] for r in meta["records"])
        if meta["records"]:
            self.shards[meta["shard"]] = meta["sha256"]
        self.problems += meta["problems"]
        s = meta["sums"]
        if s:  # in shard order, one row at a time: the same float64 additions as np.sum(rows, axis=0)
            self.n += s["n"]
            self.sum = np.asarray(s["sum"]) if self.sum is None else self.sum + np.asarray(s["sum"])
            self.sumsq = np.asarray(s["sumsq"]) if self.sumsq is None else self.sumsq + np.asarray(s["sumsq"])

    def sums(self) -> dict | None:
        if self.sum is None:
            return None
        return {"n": self.n, "sum": self.sum.tolist(), "sumsq": self.sumsq.tolist()}


_ENCODER = json.JSONEncoder(indent=1)  # json.dumps(obj, indent=1)'s, made once (not per record)


def _nested(obj, level: int) -> str:
    """``json.dumps(obj, indent=1)`` as it reads nested ``level`` deep in an indent-1 document."""
    return _ENCODER.encode(obj).replace("\n", "\n" + " " * level)  # json escapes newlines inside strings


def write_index(split_dir: Path, split: str, shards: int, scan_problems: list[dict]) -> dict:
    """Write ``split_dir/index.json`` (atomically: it marks the split complete) from the
    sidecars of shards 0..shards-1, in order; returns the split's summary:
    {"kept", "seconds", "shards": {name: sha256}, "problems": [...], "sums"}."""
    split_dir = Path(split_dir)
    totals = _Totals()

    def body(raw: io.BufferedWriter) -> None:
        f = io.TextIOWrapper(raw, encoding="utf-8", newline="")  # json.dumps is ASCII: bytes as write_json's
        f.write('{\n "split": ' + json.dumps(split) + ',\n "utterances": [')
        sep = "\n  "
        for k in range(shards):
            meta = json.loads((split_dir / f"{shard_name(k)}.json").read_text())
            if meta["records"]:  # the shard's records as the list's items: "[\n  {...},\n  {...}\n ]" less brackets
                f.write(sep + _nested(meta["records"], 1)[4:-3])
                sep = ",\n  "
            totals.add(meta)
        f.write("]" if sep == "\n  " else "\n ]")
        for key, value in (("shards", totals.shards), ("problems", scan_problems + totals.problems),
                           ("sums", totals.sums())):
            f.write(f',\n "{key}": ' + _nested(value, 1))
        f.write("\n}")
        f.flush()
        f.detach()  # atomic_write fsyncs and closes the raw file

    atomic_write(split_dir / "index.json", body)
    return {"kept": totals.kept, "seconds": totals.seconds, "shards": totals.shards,
            "problems": scan_problems + totals.problems, "sums": totals.sums()}
