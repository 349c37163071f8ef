"""Compressed feature shards and the per-split index.

A shard ``SPLIT/shard-NNNNN.npz`` (zip-deflated numpy, or stored raw: ``prepare --raw``) holds up
to 64 utterances: their frames stacked as one float16 ``(sum T, 93)`` array with row offsets, ids, transcripts
and durations. float16 keeps 11 significant bits: an error of at most 0.05 dB on the
log-mel values (|x| < 128) and ~0.1% relative on MFCCs, well under the speaker and noise
variation, for half the disk and read time. ``SPLIT/shard-NNNNN.json`` is written after
the shard, with its records and SHA-256; only shards with it count as done, and
``SPLIT/index.json`` (all records) is written last, so a killed prepare never leaves a
partial shard that is read as whole.

Shards are byte-deterministic (numpy opens each zip entry by name, which stamps it with
the zip format's earliest time, in 1980, not the time of writing; a test keeps this true), so
a shard rebuilt by ``prepare`` after damage is identical to the original and matches the index's checksum.
"""
from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np

from speechperf.atomic import atomic_write, atomic_write_text
from speechperf.errors import SpeechperfError


class ShardError(SpeechperfError):
    """A shard or index is missing, truncated or does not match its checksum."""


def shard_name(k: int) -> str:
    return f"shard-{k:05d}"


def as_stored(feats: np.ndarray) -> np.ndarray:
    """``feats`` as a shard stores them: float16, every zero positive. A value that is zero in
    exact arithmetic (an MFCC of a silent frame) comes out of the float64 DCT as rounding noise
    of either sign, +-1e-14, which float16 rounds to +0 or -0: different bytes for the same
    value, chosen by the matrix kernel's summation order (MKL's code path on this CPU)."""
    return feats.astype(np.float16) + np.float16(0)  # -0 + +0 is +0 in IEEE arithmetic


def write_shard(path: Path, feats: list[np.ndarray], ids: list[str], transcripts: list[str],
                durations: list[float], compress: bool = True) -> str:
    """Write one shard atomically; returns its SHA-256 (a function of the content only).
    ``compress``: deflate the arrays (the zip members are stored raw otherwise: the float16
    frames deflate only ~1.2x, and inflating them was half of a loader reader's time)."""
    offsets = np.cumsum([0] + [len(f) for f in feats]).astype(np.int64)
    buf = io.BytesIO()
    (np.savez_compressed if compress else np.savez)(buf, feats=as_stored(np.concatenate(feats)), offsets=offsets,
                        ids=np.array(ids), transcripts=np.array(transcripts), durations=np.array(durations))
    data = buf.getvalue()
    atomic_write(path, lambda f: f.write(data))
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path) -> str | None:
    """SHA-256 of a file's bytes; None when it does not exist."""
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except FileNotFoundError:
        return None


def _recorded(feats: Path, key: str):
    """``FEATS/prepare.json``'s ``key`` (None: no such record)."""
    try:
        return json.loads((Path(feats) / "prepare.json").read_text())[key]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _recorded_corpus(feats: Path) -> str | None:
    """The corpus folder ``prepare`` read, as ``FEATS/prepare.json`` records it (None: no such
    record, or the splits came from lhotse manifests)."""
    corpus = _recorded(feats, "corpus")
    return None if corpus is None else str(corpus)


def _corpus_of(feats: Path) -> Path | None:
    """The corpus folder ``prepare`` read, where it still exists here."""
    corpus = _recorded_corpus(feats)
    return Path(corpus) if corpus is not None and Path(corpus).is_dir() else None


def repair_command(split_dir: Path) -> str:
    """The command that rebuilds ``split_dir``'s missing or damaged shards and index."""
    split_dir = Path(split_dir)
    manifests = _recorded(split_dir.parent, "manifests")
    if isinstance(manifests, dict) and isinstance(manifests.get(split_dir.name), list):  # prepared from lhotse's
        named = " ".join(f"--manifest {split_dir.name}={m}" for m in manifests[split_dir.name])
        return f"speechperf prepare {split_dir.parent} {named}"
    corpus = _recorded_corpus(split_dir.parent) or "CORPUS"  # prepare.json lost too: the user knows where it is
    return f"speechperf prepare {corpus} {split_dir.parent} --splits {split_dir.name}"


def _shard_bytes(path: Path, sha256: str | None) -> bytes:
    """The shard file's bytes, checked against ``sha256`` when given; a missing or altered
    shard is a ShardError naming it and the repair command."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ShardError(f"shard {path} is missing; rebuild it with: {repair_command(path.parent)}") from None
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise ShardError(f"shard {path} does not match its checksum (truncated or modified); rebuild it with: "
                         f"{repair_command(path.parent)}")
    return data


def read_shard(path: Path, sha256: str | None = None) -> dict[str, tuple[np.ndarray, str, float]]:
    """id -> (frames (T, 93) float32, transcript, duration); verifies the checksum if given."""
    path = Path(path)
    data = _shard_bytes(path, sha256)
    try:
        z = np.load(io.BytesIO(data))
        feats, offsets = z["feats"], z["offsets"]
        ids, texts, durs = z["ids"], z["transcripts"], z["durations"]
    except Exception as e:  # zipfile/numpy raise several types for damaged archives
        raise ShardError(f"shard {path} cannot be read ({type(e).__name__}: {e}); rebuild it with: "
                         f"{repair_command(path.parent)}") from e
    return {str(ids[i]): (feats[offsets[i]: offsets[i + 1]].astype(np.float32), str(texts[i]), float(durs[i]))
            for i in range(len(ids))}


def load_index(split_dir: Path) -> dict:
    """The split's index: {"split", "utterances": [records], "shards": {name: sha256}, ...}."""
    path = Path(split_dir) / "index.json"
    if not path.exists():
        corpus = _corpus_of(path.parent.parent)
        if corpus is not None and not (corpus / path.parent.name).is_dir():  # nothing to prepare it from
            prepared = sorted(p.parent.name for p in path.parent.parent.glob("*/index.json"))
            raise ShardError(f"{path.parent.parent} has no split {path.parent.name!r} (prepared: "
                             f"{', '.join(prepared) or 'none'}), and its corpus {corpus} has none to prepare")
        raise ShardError(f"{path} is missing: the split was not prepared (or prepare was interrupted); "
                         f"prepare it with: {repair_command(path.parent)}")
    try:
        index = json.loads(path.read_text())
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, an integer past 4,300 digits: all ValueErrors
        raise ShardError(f"{path} is not valid JSON ({e}); rebuild it with: {repair_command(path.parent)}") from e
    shape = [f"{key!r} ({kind.__name__})" for key, kind in (("utterances", list), ("shards", dict))
             if not isinstance(index, dict) or not isinstance(index.get(key), kind)]
    if shape:  # valid JSON of another shape (another tool's index.json): refused here, not a KeyError in a reader
        raise ShardError(f"{path} is not a split index of speechperf's (it lacks {' and '.join(shape)}); "
                         f"rebuild it with: {repair_command(path.parent)}")
    return index


def write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1))


def read_rows(path: Path, sha256: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """A shard as stored: (frames (sum T, 93) float16, row offsets (n + 1,), ids (n,), bytes
    decompressed); the training loader's reader (it converts only the rows it batches)."""
    path = Path(path)
    data = _shard_bytes(path, sha256)
    try:
        z = np.load(io.BytesIO(data))
        feats, offsets, ids = z["feats"], z["offsets"], z["ids"]
        size = sum(z.zip.getinfo(f"{k}.npy").file_size for k in ("feats", "offsets", "ids"))
    except Exception as e:  # zipfile/numpy raise several types for damaged archives
        raise ShardError(f"shard {path} cannot be read ({type(e).__name__}: {e}); rebuild it with: "
                         f"{repair_command(path.parent)}") from e
    return feats, offsets, ids, size
