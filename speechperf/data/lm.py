"""Dictionary and bigram language model of a prepared dataset (``FEATS/lm.json``).

Built once from the transcripts of the ``train-*`` splits (``speechperf lm build FEATS``)
and loaded by the decoders. Smoothing: interpolated absolute discounting, D = 0.75,

    P(w | v) = max(c(v, w) - D, 0) / c(v) + D * N1+(v) / c(v) * P_uni(w),
    P_uni(w) = (c(w) + 1) / (N + V)                       (add-one unigram),

with ``<s>`` as the history of a sentence's first word and P_uni for unseen histories;
each conditional sums to one over the vocabulary (tested). An ARPA file is written too,
for decoders that load ARPA (flashlight-text).
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from collections import Counter
from pathlib import Path

import numpy as np

from speechperf.atomic import atomic_write_text
from speechperf.corpus import alphabet
from speechperf.errors import SpeechperfError
from speechperf.data.check import train_splits_of
from speechperf.features.shards import load_index

LM_NAME = "lm.json"
DISCOUNT = 0.75
START = "<s>"


class LMError(SpeechperfError):
    """A language model file is missing, corrupt or made for another alphabet."""


class BigramLM:
    """Word bigram probabilities over a fixed vocabulary (index = position in ``words``)."""

    def __init__(self, unigrams: dict[str, int], bigrams: dict[str, dict[str, int]]):
        self.words = sorted(unigrams)
        self.index = {w: i for i, w in enumerate(self.words)}
        n, v = sum(unigrams.values()), len(self.words)
        self.uni = np.array([(unigrams[w] + 1) / (n + v) for w in self.words])
        self.bigrams = bigrams
        self._rows: dict[str, np.ndarray] = {}

    def row(self, prev: str) -> np.ndarray:
        """P(. | prev) as a vector over the vocabulary (cached)."""
        if prev not in self._rows:
            follow = self.bigrams.get(prev)
            if not follow:
                p = self.uni.copy()
            else:
                total = sum(follow.values())
                p = self.uni * (DISCOUNT * len(follow) / total)
                for w, c in follow.items():
                    p[self.index[w]] += max(c - DISCOUNT, 0.0) / total
            self._rows[prev] = p
        return self._rows[prev]

    def logprob(self, word: str, prev: str) -> float:
        return math.log(self.row(prev)[self.index[word]])


def count(transcripts) -> tuple[Counter, dict[str, Counter]]:
    uni: Counter = Counter()
    bi: dict[str, Counter] = {}
    for text in transcripts:
        prev = START
        for w in text.split():
            uni[w] += 1
            bi.setdefault(prev, Counter())[w] += 1
            prev = w
    return uni, bi


def _check_words(words) -> None:
    for w in words:
        try:
            alphabet.encode(w)
        except alphabet.AlphabetError as e:
            raise LMError(f"dictionary word {w!r}: {e}") from None


def build_lm_for_features(features: Path, split: str | None = None) -> dict:
    """Count the train-* transcripts of ``features`` and write lm.json (+ lm.arpa); a row."""
    t0 = time.perf_counter()
    features = Path(features)
    if not features.is_dir():
        raise LMError(f"{features} is not a prepared features folder (speechperf prepare writes one)")

    splits = [split] if split else train_splits_of(features)
    if not splits:
        raise LMError(f"no prepared train-* split under {features}")
    try:
        texts = [r["transcript"] for s in splits for r in load_index(features / s)["utterances"]]
    except (KeyError, TypeError) as e:
        raise LMError(f"an index.json under {features} ({', '.join(splits)}) lacks utterances/transcript: {e}") from e
    uni, bi = count(texts)
    _check_words(uni)
    body = {"alphabet": list(alphabet.SYMBOLS), "discount": DISCOUNT, "splits": splits, "unigrams": dict(uni),
            "bigrams": {k: dict(v) for k, v in bi.items()}}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    atomic_write_text(features / LM_NAME, json.dumps({**body, "sha256": digest}))
    write_arpa(BigramLM(body["unigrams"], body["bigrams"]), features / "lm.arpa")
    return {"path": str(features / LM_NAME), "words": len(uni), "bigrams": sum(len(v) for v in bi.values()),
            "sentences": len(texts), "seconds": round(time.perf_counter() - t0, 3)}


def load_lm(features_or_path: Path) -> BigramLM:
    """Load and verify ``lm.json`` (building it first when a features folder has none)."""
    path = Path(features_or_path)
    if path.is_dir():
        if not (path / LM_NAME).exists():
            build_lm_for_features(path)
        path = path / LM_NAME
    try:
        data = json.loads(path.read_text())
        digest = data.pop("sha256")
    except (OSError, json.JSONDecodeError, KeyError, AttributeError) as e:
        raise LMError(f"{path} is not a readable speechperf LM ({type(e).__name__}: {e})") from e
    if hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest() != digest:
        raise LMError(f"{path} does not match its checksum (modified or truncated); rebuild with speechperf lm build")
    if data.get("alphabet") != list(alphabet.SYMBOLS):
        raise LMError(f"{path} was built for another alphabet")
    _check_words(data["unigrams"])
    return BigramLM(data["unigrams"], data["bigrams"])


def backoff(lm: BigramLM, prev: str) -> float:
    """The interpolation weight D * N1+(prev) / c(prev) of the unigram term (1 if unseen)."""
    follow = lm.bigrams.get(prev)
    return DISCOUNT * len(follow) / sum(follow.values()) if follow else 1.0


def write_arpa(lm: BigramLM, path: Path) -> None:
    """The same model as an ARPA bigram file (log10): a listed bigram carries its full
    interpolated probability, an unlisted one backs off with the unigram weight above."""
    lines = ["\\data\\", f"ngram 1={len(lm.words) + 2}",
             f"ngram 2={sum(len(v) for v in lm.bigrams.values())}", "", "\\1-grams:",
             f"-99\t{START}\t{math.log10(backoff(lm, START)):.6f}", "-99\t</s>"]
    for w, p in zip(lm.words, lm.uni):
        lines.append(f"{math.log10(p):.6f}\t{w}\t{math.log10(backoff(lm, w)):.6f}")
    lines += ["", "\\2-grams:"]
    for prev, follow in sorted(lm.bigrams.items()):
        row = lm.row(prev)
        lines += [f"{math.log10(row[lm.index[w]]):.6f}\t{prev} {w}" for w in sorted(follow)]
    lines += ["", "\\end\\", ""]
    atomic_write_text(path, "\n".join(lines))
