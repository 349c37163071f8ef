"""One checksum of a prepared features folder: the data a training run reads, as one value
that two machines can compare before comparing their training curves.

It is the sha256 over ``stats.json`` (the normalization) and every ``SPLIT/index.json``
(each split's utterances, transcripts, frame counts, feature sums and the sha256 of every
shard's bytes: features/shards.py writes byte-deterministic shards), each file taken as its
path relative to the folder and the sha256 of its bytes, in sorted path order. So it changes
when any feature value, transcript, split or the statistics change, and not with the
folder's location or the files' times.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

OVER = "sha256 of stats.json and every SPLIT/index.json (path and sha256 of each, sorted)"  # what the checksum covers


def features_sha256(feats: Path) -> str | None:
    """The checksum of the features folder ``feats`` (:data:`OVER`); None when it holds
    neither a stats.json nor any split index (not a prepared features folder)."""
    feats = Path(feats)
    files = sorted(p for p in [feats / "stats.json", *feats.glob("*/index.json")] if p.is_file())
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.relative_to(feats).as_posix()}\0{hashlib.sha256(path.read_bytes()).hexdigest()}\n".encode())
    return digest.hexdigest()
