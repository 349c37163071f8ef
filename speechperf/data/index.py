"""The training index as compact arrays: what the planner and the readers need of every utterance.

A list of one dict per utterance costs ~1 kB each (300 MB at LibriSpeech's 281,241) and, in
forked reader processes, is copied page by page as soon as a reader touches a record's
reference count (or the garbage collector walks it). Here each field is one numpy array
(shard number, row in the shard, frames, duration, the rank of the id in sorted order), and
ids and transcripts are one UTF-8 byte array each with offsets: a few dozen bytes per
utterance, in buffers that forked readers share without copying (numpy data has no per-item
reference counts).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from speechperf.errors import SpeechperfError
from speechperf.features.shards import load_index, repair_command


@dataclass(frozen=True)
class Index:
    """Utterance i lives in shard ``keys[shard[i]]`` at row ``offset[i]``; order: the splits'
    index files, concatenated (the order the planner's tie-breaks and rank slices refer to)."""

    keys: list[str]  # shard keys "SPLIT/shard-NNNNN", in order of first appearance
    shas: list[str | None]  # SHA-256 of each shard (None: not recorded)
    shard: np.ndarray  # (N,) int32 index into keys
    offset: np.ndarray  # (N,) int32 row of the utterance in its shard
    frames: np.ndarray  # (N,) int32 feature frames
    duration: np.ndarray  # (N,) float64 seconds of audio
    id_rank: np.ndarray  # (N,) int32 position of the id in sorted (code point) order: the tie-break
    id_bytes: np.ndarray  # (sum,) uint8 UTF-8 ids, joined
    id_off: np.ndarray  # (N + 1,) int64
    text_bytes: np.ndarray  # (sum,) uint8 UTF-8 transcripts, joined
    text_off: np.ndarray  # (N + 1,) int64

    def __len__(self) -> int:
        return len(self.frames)

    def id(self, i: int) -> str:
        return self.id_bytes[self.id_off[i]: self.id_off[i + 1]].tobytes().decode()

    def transcript(self, i: int) -> str:
        return self.text_bytes[self.text_off[i]: self.text_off[i + 1]].tobytes().decode()

    def nbytes(self) -> int:
        """Bytes of the arrays (what a process holds of this index)."""
        return sum(getattr(self, f).nbytes for f in ("shard", "offset", "frames", "duration", "id_rank", "id_bytes",
                                                     "id_off", "text_bytes", "text_off"))


def _joined(strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """UTF-8 bytes of ``strings`` joined, and the (len + 1,) offsets of each."""
    enc = [s.encode() for s in strings]
    off = np.zeros(len(enc) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in enc], out=off[1:])
    return np.frombuffer(b"".join(enc), dtype=np.uint8).copy(), off


def from_columns(keys: list[str], shas: list, shard, offset, frames, duration, ids: list[str],
                 transcripts: list[str]) -> Index:
    """An Index from per-utterance columns (``shard``: numbers into ``keys``)."""
    if not len(frames):
        raise SpeechperfError("an index with no utterances")
    order = np.argsort(np.array(ids), kind="stable")  # code point order, as Python's str comparison
    id_rank = np.empty(len(ids), dtype=np.int32)
    id_rank[order] = np.arange(len(ids), dtype=np.int32)
    id_bytes, id_off = _joined(ids)
    text_bytes, text_off = _joined(transcripts)
    return Index(list(keys), list(shas), np.asarray(shard, np.int32), np.asarray(offset, np.int32),
                 np.asarray(frames, np.int32), np.asarray(duration, np.float64), id_rank, id_bytes, id_off,
                 text_bytes, text_off)


def _columns(path: Path, utts: list, split: str, numbers: dict, cols: dict) -> None:
    """The records ``utts`` of ``path`` appended to ``cols``; a record that is not one of speechperf's
    (a field missing, of another type) is refused naming the file, not a KeyError in the loader."""
    try:
        cols["shard"].append(np.fromiter((numbers[f"{split}/{u['shard']}"] for u in utts), np.int32, len(utts)))
    except KeyError as e:
        if all(isinstance(u, dict) and "shard" in u for u in utts):
            raise SpeechperfError(f"{path}: an utterance names shard {e}, which its shard list lacks") from None
        raise SpeechperfError(f"{path}: an utterance record lacks its 'shard'; the index is not speechperf's "
                              f"(rebuild it with: {repair_command(path.parent)})") from None
    except TypeError as e:
        raise SpeechperfError(f"{path}: an utterance record is not an object ({e}); the index is not speechperf's "
                              f"(rebuild it with: {repair_command(path.parent)})") from None
    try:
        for col, field, dtype in (("offset", "offset", np.int32), ("frames", "frames", np.int32),
                                  ("duration", "duration", np.float64)):
            cols[col].append(np.fromiter((u[field] for u in utts), dtype, len(utts)))
        ids, texts = [str(u["id"]) for u in utts], [str(u["transcript"]) for u in utts]
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise SpeechperfError(f"{path}: an utterance record lacks a field or holds another type "
                              f"({type(e).__name__}: {e}); the index is not speechperf's "
                              f"(rebuild it with: {repair_command(path.parent)})") from None
    cols["ids"] += ids
    cols["texts"] += texts


def load(feats: Path, splits: list[str]) -> Index:
    """The compact index of ``splits`` of the prepared folder ``feats`` (each split's
    index.json read once and dropped before the next)."""
    keys, shas, numbers = [], [], {}
    cols: dict[str, list] = {k: [] for k in ("shard", "offset", "frames", "duration", "ids", "texts")}
    for split in splits:
        index = load_index(Path(feats) / split)
        for name, sha in index["shards"].items():
            numbers[f"{split}/{name}"] = len(keys)
            keys.append(f"{split}/{name}")
            shas.append(sha)
        utts = index.pop("utterances")
        del index
        _columns(Path(feats) / split / "index.json", utts, split, numbers, cols)
        del utts
    if not cols["ids"]:
        raise SpeechperfError(f"no utterances in {', '.join(splits)} under {feats}")
    cat = {k: np.concatenate(cols[k]) for k in ("shard", "offset", "frames", "duration")}
    return from_columns(keys, shas, cat["shard"], cat["offset"], cat["frames"], cat["duration"], cols["ids"],
                        cols["texts"])


def librispeech_like(seed: int = 0, splits: tuple[int, ...] = (28_539, 104_014, 148_688),
                     per_shard: int = 64) -> Index:
    """A generated index with LibriSpeech 960 h's split sizes (train-clean-100, -360,
    train-other-500: 281,241 utterances, 4,396 shards of 64) and a duration spread like
    its own: most 10-17 s, a tail of short ones down to ~1 s, a few up to 35 s, mean ~12.3 s.
    For planning and memory benchmarks and tests: it names shards that do not exist."""
    rng = np.random.default_rng(seed)
    keys, shard, offset, durs = [], [], [], []
    for s, n in enumerate(splits):
        k = -(-n // per_shard)
        shard.append(len(keys) + np.arange(n) // per_shard)
        offset.append(np.arange(n) % per_shard)
        keys += [f"train-{s}/shard-{j:05d}" for j in range(k)]
        main = np.clip(rng.normal(13.9, 1.8, n), 10.0, 17.0)
        short = rng.uniform(1.0, 10.0, n)
        long = rng.uniform(17.0, 35.0, n)
        pick = rng.random(n)
        durs.append(np.where(pick < 0.18, short, np.where(pick < 0.995, main, long)))
    duration = np.round(np.concatenate(durs), 4)
    frames = np.floor(duration * 100).astype(np.int32) - 1  # 10 ms hop, 25 ms window
    ids = [f"{i // 10_000}-{i % 10_000:04d}" for i in range(len(duration))]
    return from_columns(keys, [None] * len(keys), np.concatenate(shard), np.concatenate(offset), frames, duration,
                        ids, ["a"] * len(ids))
