"""Check the data a run will use before the clock starts.

``verify_splits`` opens every split a run reads (the train splits, the validation split,
the final-evaluation splits), verifies its index (readable, non-empty, every record's shard
listed with a checksum and present on disk) and returns what will be used, for the run to
record. A split that should be there and is not is an error naming it and its path, before
the model exists: a run must not train on part of the data, or skip a final split, without
saying so.

Which splits "should be there" when the user did not name them:

- train: every ``train-*`` folder under FEATS plus the train splits ``stats.json`` was
  computed over (a train split whose folder vanished is missing, not absent);
- final: those of dev-clean, dev-other, test-clean, test-other that were prepared (a
  folder, or a split listed in ``prepare.json``); one never prepared is not used.

Named splits (``train.train_splits``, ``train.eval.final_splits``) are used exactly; each must be
intact. Shard contents are not hashed here (the loader checks every shard's checksum when
it reads it): this check is about which splits a run uses, and costs a stat per shard.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

from speechperf.corpus.librispeech import is_train_split
from speechperf.data.batching import Batching
from speechperf.errors import SpeechperfError
from speechperf.features.shards import ShardError, file_sha256, load_index, repair_command
from speechperf.features.stats import read_stats

FINAL_SPLITS = ("dev-clean", "dev-other", "test-clean", "test-other")


class SplitError(SpeechperfError):
    """A split a run will use is missing, unreadable or empty, or the batch does not fit the data."""


def verify_splits(feats: Path, train: list[str] | None = None, valid: str = "dev-clean",
                  final: list[str] | None = None, batch_size: int | None = None, world: int = 1,
                  final_candidates: tuple[str, ...] = FINAL_SPLITS) -> dict:
    """Verify every split a run will use; returns {"train", "valid", "final", "splits": {name: facts}}.

    ``train``/``final`` None: the splits found as described in the module docstring (final:
    those of ``final_candidates`` prepared); a list: exactly those (named by the user).
    ``batch_size``: the global batch over ``world`` processes, refused when it is larger
    than the training data (the run would train with smaller batches than it records) or
    smaller than ``world`` (every batch would be dropped: no process gets an utterance).
    """
    feats = Path(feats)
    if not (feats / "features.json").exists():
        raise SplitError(f"{feats} is not a prepared features folder (no features.json); run speechperf prepare")
    if train is None:
        train = train_splits_of(feats)
        if not train:
            raise SplitError(f"{feats} has no prepared train-* split")
    if not train:
        raise SplitError("train.train_splits names no split to train on")
    if final is None:
        final = [s for s in final_candidates if s in _prepared(feats)]
    facts = {}
    for split in dict.fromkeys([*train, valid, *final]):  # once each, in order
        role = "train" if split in train else "validation" if split == valid else "final-evaluation"
        facts[split] = _verify_index(feats, split, role)
    n_train = sum(facts[s]["utterances"] for s in train)
    if batch_size is not None and batch_size > n_train:
        raise SplitError(f"loader.batch_size={batch_size} is larger than the {n_train} utterances of "
                         f"{', '.join(train)} under {feats}: use a batch of at most {n_train}")
    if batch_size is not None and batch_size < world:
        raise SplitError(f"loader.batch_size={batch_size} is the batch over all {world} processes: "
                         f"it must be at least {world}")
    return {"train": list(train), "valid": valid, "final": list(final), "splits": facts}


def verify_run(feats: Path, batching: Batching, train: str, valid: str, final: str) -> dict:
    """Every split a run reads (``train.train_splits``, ``train.eval.split``,
    ``train.eval.final_splits`` as written in its config), verified as ``verify_splits`` does against
    the run's global batch (``batching.checked_batch``), and the feature statistics its batches are
    normalized with (``loader.normalize``), readable and sane."""
    if batching.loader.normalize:
        read_stats(feats)
    return verify_splits(feats, parse_splits(train), valid, parse_splits(final), batching.checked_batch,
                         batching.world)


def parse_splits(value: str) -> list[str] | None:
    """A config field's comma-separated split list: "" = None (found), "none" = []."""
    value = value.strip()
    if not value:
        return None
    if value.lower() == "none":
        return []
    return [s.strip() for s in value.split(",") if s.strip()]


def _prepared(feats: Path) -> set[str]:
    """Splits that were prepared here: folders, and the splits prepare.json and stats.json name."""
    names = {p.name for p in feats.iterdir() if p.is_dir()}
    for file, key in (("prepare.json", "splits"), ("stats.json", "splits")):
        path = feats / file
        if path.exists():
            try:
                listed = json.loads(path.read_text()).get(key, [])
            except (json.JSONDecodeError, AttributeError) as e:
                raise SplitError(f"{path} cannot be read ({e}); it is rewritten by speechperf prepare") from e
            names.update(r["split"] if isinstance(r, dict) else r for r in listed)
    return names


def train_splits_of(feats: Path) -> list[str]:
    """The training splits of a features folder: every prepared ``train*`` split (a folder,
    or one that ``prepare.json``/``stats.json`` list, so that a vanished one is missing)."""
    return sorted(s for s in _prepared(Path(feats)) if is_train_split(s))


def _shard_sha256(path: Path) -> str | None:
    """The shard's sha256, hashed once per process for a file of unchanged size and mtime: a new
    run verifies its splits before its folder exists and again on every rank in _train, and
    would otherwise read every shard twice (LibriSpeech 960 h: tens of GB)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return _hashed(str(path), st.st_size, st.st_mtime_ns, st.st_ino)


@lru_cache(maxsize=None)
def _hashed(path: str, _size: int, _mtime_ns: int, _inode: int) -> str | None:
    return file_sha256(Path(path))


def _verify_index(feats: Path, split: str, role: str) -> dict:
    split_dir = feats / split
    try:
        index = load_index(split_dir)
    except ShardError as e:
        # Mini LibriSpeech validates on dev-clean-2: the way to name another split, where it matters
        hint = "; choose the validation split with train.eval.split=NAME" if role == "validation" else ""
        raise SplitError(f"{role} split {split!r}: {e}{hint}") from None
    path = split_dir / "index.json"
    records, shards = index.get("utterances"), index.get("shards")
    if not isinstance(records, list) or not isinstance(shards, dict):
        raise SplitError(f"{role} split {split!r}: {path} has no utterances or shards list; "
                         f"rebuild it with: {repair_command(split_dir)}")
    if not records:
        raise SplitError(f"{role} split {split!r}: {path} lists no utterances (every file was dropped? "
                         f"see {feats / 'prepare.json'})")
    names = sorted({r.get("shard") for r in records})
    for name in names:
        if not shards.get(name):
            raise SplitError(f"{role} split {split!r}: {path} has no checksum for shard {name!r}; "
                             f"rebuild it with: {repair_command(split_dir)}")
        shard = split_dir / f"{name}.npz"
        if not shard.is_file() or shard.stat().st_size == 0:
            raise SplitError(f"{role} split {split!r}: shard {shard} is missing or empty; "
                             f"rebuild it with: {repair_command(split_dir)}")
    # every shard's bytes against its checksum, before a run's folder and clock exist (a damaged
    # shard found in epoch 3 would fail a run that had already started): hashlib releases the
    # GIL, so a few threads read and hash at the disk's speed (130 MB, the demo's, in ~0.3 s)
    with ThreadPoolExecutor(max_workers=4) as pool:
        sums = dict(zip(names, pool.map(lambda n: _shard_sha256(split_dir / f"{n}.npz"), names)))
    for name in names:
        if sums[name] != shards[name]:
            raise SplitError(f"{role} split {split!r}: shard {split_dir / f'{name}.npz'} does not match its "
                             f"checksum (truncated or modified); rebuild it with: {repair_command(split_dir)}")
    return {"utterances": len(records), "shards": len(shards),
            "hours": round(sum(r.get("duration", 0.0) for r in records) / 3600, 4)}
