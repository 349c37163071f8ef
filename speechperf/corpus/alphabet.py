"""The 30-symbol output alphabet of docs/spec.md A and text normalization.

Index 0 is the CTC blank (torch's ``ctc_loss`` default), then space, a..z, apostrophe,
and the separator that splits doubled letters (``cool`` is emitted as ``co_ol``): CTC
collapses repeated symbols, so without a separator a doubled letter could only be
produced through an intervening blank.
"""
from __future__ import annotations

import re

import numpy as np

from speechperf.errors import SpeechperfError

BLANK = 0
SPACE = 1
SEPARATOR_CHAR = "_"
# Index -> symbol. The blank has no printable form; "" keeps joins simple.
SYMBOLS: tuple[str, ...] = ("", " ", *"abcdefghijklmnopqrstuvwxyz", "'", SEPARATOR_CHAR)
SEPARATOR = len(SYMBOLS) - 1
NUM_SYMBOLS = len(SYMBOLS)  # 30
CHAR_TO_INDEX = {c: i for i, c in enumerate(SYMBOLS) if c}
TEXT_CHARS = frozenset(" abcdefghijklmnopqrstuvwxyz'")

_SPACES = re.compile(r"\s+")


class AlphabetError(SpeechperfError, ValueError):
    """A transcript holds characters the alphabet cannot express."""


def normalize(text: str) -> str:
    """Lower-case, collapse white space and strip; raises AlphabetError on other characters.

    LibriSpeech transcripts are upper case with single spaces, so this is a no-op for them
    apart from the case; anything else outside a-z, apostrophe and space is an error rather
    than silently dropped, because a dropped character changes the reference.
    """
    out = _SPACES.sub(" ", text.lower()).strip()
    bad = sorted(set(out) - TEXT_CHARS)
    if bad:
        raise AlphabetError(f"characters outside the alphabet: {''.join(bad)!r}")
    return out


def encode(text: str) -> list[int]:
    """Normalized text -> label indices, with the separator between doubled characters."""
    labels: list[int] = []
    prev = ""
    for ch in text:
        if ch not in CHAR_TO_INDEX or ch == SEPARATOR_CHAR:
            raise AlphabetError(f"character {ch!r} is not in the alphabet")
        if ch == prev:
            labels.append(SEPARATOR)
        labels.append(CHAR_TO_INDEX[ch])
        prev = ch
    return labels


_BYTE_TO_INDEX = np.full(256, -1, dtype=np.int64)  # ASCII byte -> label index; -1: not a text character
for _c, _i in CHAR_TO_INDEX.items():
    if _c != SEPARATOR_CHAR:
        _BYTE_TO_INDEX[ord(_c)] = _i


def encode_array(text: str) -> np.ndarray:
    """:func:`encode` as an int64 array, computed with numpy: the loader's readers encode every
    transcript of every batch, and the per-character loop was ~9% of a reader's time on
    LibriSpeech-length utterances (ledger: bench_shard_format)."""
    raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    labels = _BYTE_TO_INDEX[raw]  # (n,) a multi-byte character's bytes all map to -1
    if len(labels) and labels.min() < 0:
        return np.array(encode(text), dtype=np.int64)  # raises, naming the character
    doubled = np.flatnonzero(raw[1:] == raw[:-1]) + 1  # where a character repeats the previous one
    return np.insert(labels, doubled, SEPARATOR)  # the separator goes before the repeat


def decode(labels) -> str:
    """Label indices (already CTC-collapsed, no blanks expected) -> text without separators."""
    return "".join(SYMBOLS[int(i)] for i in labels if int(i) not in (BLANK, SEPARATOR))


def collapse(path) -> list[int]:
    """A frame-level CTC path -> labels: merge repeats, then drop blanks."""
    out: list[int] = []
    prev = -1
    for i in path:
        i = int(i)
        if i != prev and i != BLANK:
            out.append(i)
        prev = i
    return out
