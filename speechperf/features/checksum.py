"""One checksum of a prepared features folder: the data a training run reads, as one value
that two machines can compare before comparing their training curves.

It is the sha256 over ``stats.json`` (the normalization), every ``SPLIT/index.json``
(each split's utterances, transcripts, frame counts, feature sums and the sha256 of every
shard's bytes: features/shards.py writes byte-deterministic shards) and, where the folder has
BPE units, every ``units/bpe-N.json`` (the record of a SentencePiece model: its sha256, and
what it was trained from; data/units.py), each file taken as its path relative to the folder
and the sha256 of its bytes, in sorted path order. So it changes when any feature value,
transcript, split, the statistics or a BPE model change, and not with the folder's location
or the files' times; a folder without units has the checksum it had before units existed.
``units``: only that units' record (a spec, "char": none, "bpe:500": ``units/bpe-500.json``),
so a run's checksum does not change when another run adds units of its own to the folder.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

OVER = ("sha256 of stats.json, every SPLIT/index.json and, where present, units/*.json "
        "(path and sha256 of each, sorted)")  # what the checksum covers
UNITS_RECORDS = "units/*.json"  # data/units.py's records of BPE models (that module sits above this one)


def features_sha256(feats: Path, units: str | None = None) -> str | None:
    """The checksum of the features folder ``feats`` (:data:`OVER`); None when it holds
    neither a stats.json nor any split index (not a prepared features folder). ``units``: the
    one units spec whose record it covers ("char": none; None: every record present)."""
    feats = Path(feats)
    files = sorted(p for p in [feats / "stats.json", *feats.glob("*/index.json")] if p.is_file())
    if not files:
        return None
    if units is None:
        files = sorted(files + list(feats.glob(UNITS_RECORDS)))
    elif units.startswith("bpe:"):
        files = sorted(files + [p for p in [feats / "units" / f"bpe-{units[4:]}.json"] if p.is_file()])
    digest = hashlib.sha256()
    for path in files:
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        digest.update(f"{path.relative_to(feats).as_posix()}\0{sha}\n".encode())
    return digest.hexdigest()
