"""CTC word beam search (Scheidl et al.): beams may only spell dictionary words, separated by
non-word characters (space), and completed words are scored by the bigram LM.

Modes: ``words`` (dictionary constraint only), ``ngrams`` (LM factor when a word
completes), ``ngrams_forecast`` (a partial word is scored by the LM mass of every word it
can still become) and ``ngrams_forecast_sample`` (that mass estimated from a fixed-seed
sample of at most ``samples`` of those words). The dictionary is a prefix tree over label
sequences, so doubled letters carry the separator (``cool`` = c o _ o l) exactly as the
acoustic model emits them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from speechperf.data import alphabet
from speechperf.decode import register_decoder
from speechperf.decode.batch import decode_parallel
from speechperf.decode.beam import NEG_INF, logsumexp
from speechperf.decode.lm import START, BigramLM, load_lm
from speechperf.errors import SpeechperfError

MODES = ("words", "ngrams", "ngrams_forecast", "ngrams_forecast_sample")
NON_WORD = (alphabet.SPACE,)


@dataclass
class Node:
    children: dict[int, "Node"] = field(default_factory=dict)
    word: str | None = None  # set where a dictionary word ends
    ids: np.ndarray | None = None  # vocabulary indices of all words below (forecast modes)


def build_tree(words: list[str], index: dict[str, int]) -> Node:
    root = Node()
    for w in words:
        node = root
        for lab in alphabet.encode(w):
            node = node.children.setdefault(lab, Node())
        node.word = w
    _collect(root, index)
    return root


def _collect(node: Node, index: dict[str, int]) -> list[int]:
    ids = [index[node.word]] if node.word is not None else []
    for child in node.children.values():
        ids += _collect(child, index)
    node.ids = np.array(sorted(ids), dtype=np.int64)
    return ids


@dataclass
class Beam:
    pb: float  # log P of the paths ending in blank
    pnb: float  # log P of the paths ending in the last label
    prev: str  # last completed word (LM history)
    node: Node | None  # position in the tree inside a word, None between words
    lm: float  # log LM score of completed words (and the forecast of the partial one)


class WordBeamDecoder:
    """Dictionary-constrained CTC beam search with a bigram LM."""

    name = "wordbeam"

    def __init__(self, lm: BigramLM, beam: int, mode: str = "ngrams", lm_weight: float = 1.0, samples: int = 20,
                 prune: float = 1e-3):
        if mode not in MODES:
            raise SpeechperfError(f"unknown word beam search mode {mode!r}; one of {', '.join(MODES)}")
        self.lm, self.beam, self.mode, self.weight, self.samples = lm, beam, mode, lm_weight, samples
        self.log_prune = math.log(prune) if prune > 0 else NEG_INF
        self.root = build_tree(lm.words, lm.index)
        self.rng = np.random.default_rng(0)

    def _word_lm(self, word: str, prev: str) -> float:
        return 0.0 if self.mode == "words" else self.lm.logprob(word, prev)

    def _forecast(self, node: Node, prev: str) -> float:
        """log of the LM mass of the words reachable from ``node`` (0 outside forecast modes)."""
        if not self.mode.startswith("ngrams_forecast") or node.ids is None or len(node.ids) == 0:
            return 0.0
        ids = node.ids
        if self.mode == "ngrams_forecast_sample" and len(ids) > self.samples:
            ids = np.sort(self.rng.choice(ids, self.samples, replace=False))
            return math.log(self.lm.row(prev)[ids].sum() * len(node.ids) / self.samples)
        return math.log(self.lm.row(prev)[ids].sum())

    def _extensions(self, b: Beam, frame: np.ndarray):
        """(label, new prev, new node, LM delta) for every allowed next label."""
        base = b.lm - (self._forecast(b.node, b.prev) if b.node is not None else 0.0)
        choices = b.node.children if b.node is not None else self.root.children
        for lab, child in choices.items():
            if frame[lab] >= self.log_prune:
                yield lab, b.prev, child, base + self._forecast(child, b.prev) - b.lm
        if b.node is not None and b.node.word is not None:  # the word may end here
            for lab in NON_WORD:
                if frame[lab] >= self.log_prune:
                    yield lab, b.node.word, None, base + self._word_lm(b.node.word, b.prev) - b.lm

    def decode(self, log_probs: np.ndarray) -> str:
        """(T, 30) log-probabilities -> text of dictionary words."""
        beams: dict[tuple[int, ...], Beam] = {(): Beam(0.0, NEG_INF, START, None, 0.0)}
        for frame in log_probs:
            nxt: dict[tuple[int, ...], Beam] = {}
            for labels, b in beams.items():
                total = logsumexp(b.pb, b.pnb)
                same = nxt.setdefault(labels, Beam(NEG_INF, NEG_INF, b.prev, b.node, b.lm))
                same.pb = logsumexp(same.pb, total + float(frame[alphabet.BLANK]))
                if labels:
                    same.pnb = logsumexp(same.pnb, b.pnb + float(frame[labels[-1]]))
                for lab, prev, node, dlm in self._extensions(b, frame):
                    key = labels + (lab,)
                    ext = nxt.setdefault(key, Beam(NEG_INF, NEG_INF, prev, node, b.lm + dlm))
                    ext.pnb = logsumexp(ext.pnb, (b.pb if labels and lab == labels[-1] else total) + float(frame[lab]))
            beams = dict(sorted(nxt.items(), key=lambda kv: logsumexp(kv[1].pb, kv[1].pnb) + self.weight * kv[1].lm,
                                reverse=True)[: self.beam])
        return alphabet.decode(self._best(beams)).strip()

    def _best(self, beams: dict[tuple[int, ...], Beam]) -> tuple[int, ...]:
        """Highest score among beams that end between words or on a complete word."""
        best, best_score = (), NEG_INF
        for labels, b in beams.items():
            lm = b.lm
            if b.node is not None:
                if b.node.word is None:
                    continue  # ends inside a word that is not in the dictionary
                lm = b.lm - self._forecast(b.node, b.prev) + self._word_lm(b.node.word, b.prev)
            score = logsumexp(b.pb, b.pnb) + self.weight * lm
            if score > best_score:
                best, best_score = labels, score
        return best

    def decode_batch(self, log_probs: np.ndarray, lens, workers: int = 0) -> list[str]:
        return decode_parallel(self, log_probs, lens, workers)


@register_decoder("wordbeam")
def make_wordbeam(beam: int = 256, features=None, lm=None, mode: str = "ngrams", lm_weight: float = 1.0, **kw):
    if lm is None:
        if features is None:
            raise SpeechperfError("wordbeam needs a dictionary and LM: give features=FEATS or lm=")
        lm = load_lm(features)
    return WordBeamDecoder(lm, beam, mode=mode, lm_weight=lm_weight, **kw)
