"""CTC word beam search (Scheidl et al.): beams may only spell dictionary words, with
non-word characters (space; apostrophe and separator where not part of a word) between
them, and words are scored by the bigram LM.

Modes: ``words`` (dictionary constraint only), ``ngrams`` (LM factor when a word
completes), ``ngrams_forecast`` (a partial word is scored by the LM mass of every word it
can still become) and ``ngrams_forecast_sample`` (that mass estimated from ``samples``
words drawn from them, fixed seed). The dictionary is a prefix tree over label sequences,
so doubled letters carry the separator (``cool`` = c o _ o l) exactly as the acoustic
model emits them. The text is the recognized words joined by single spaces. A beam that
ends inside a word counts only if that prefix is itself a word.
"""
from __future__ import annotations

import math

import numpy as np

from speechperf.corpus import alphabet
from speechperf.decode import WORDBEAM_MODES, check_log_probs, register_decoder
from speechperf.decode.batch import decode_parallel
from speechperf.decode.beam import GAP
from speechperf.decode.kernel import beam_search
from speechperf.data.lm import BigramLM, load_lm
from speechperf.decode.search_tables import build_tables
from speechperf.errors import SpeechperfError
from speechperf.decode.greedy import GreedyDecoder

MODES = WORDBEAM_MODES


class WordBeamDecoder:
    """Dictionary-constrained CTC beam search with a bigram LM."""

    name = "wordbeam"

    def __init__(self, lm: BigramLM, beam: int, mode: str = "ngrams", lm_weight: float = 1.0, samples: int = 20,
                 prune: float = 1e-3, gap: float = GAP):
        if mode not in MODES:
            raise SpeechperfError(f"unknown word beam search mode {mode!r}; one of {', '.join(MODES)}")
        if beam < 1:
            raise SpeechperfError(f"beam width must be >= 1, got {beam}")
        if samples < 1:
            raise SpeechperfError(f"forecast samples must be >= 1, got {samples}")
        self.beam, self.mode, self.weight, self.samples = beam, mode, float(lm_weight), samples
        self.log_prune = math.log(prune) if prune > 0 else -math.inf
        self.gap = gap
        self.tables = build_tables(lm)
        self.is_non_word = np.zeros(alphabet.NUM_SYMBOLS, np.bool_)
        self.is_non_word[self.tables.non_word] = True

    def search(self, log_probs: np.ndarray) -> tuple[list[int], list[str]]:
        """(T, 30) log-probabilities -> (labels of the best beam, its dictionary words)."""
        check_log_probs(log_probs)
        if log_probs.shape[0] == 0:
            return [], []
        t = self.tables
        labels, words = beam_search(
            np.ascontiguousarray(log_probs, dtype=np.float64), self.beam, self.log_prune, self.gap, True,
            MODES.index(self.mode), self.weight, self.samples, alphabet.SPACE, t.next_node, t.node_word, t.node_lo,
            t.node_hi,
            self.is_non_word, t.uni, t.cum_uni, t.row_start, t.row_word, t.row_disc, t.cum_disc, t.backoff)
        return labels.tolist(), [t.words[w] for w in words.tolist()]

    def decode(self, log_probs: np.ndarray) -> str:
        """(T, 30) log-probabilities -> dictionary words joined by single spaces."""
        return " ".join(self.search(log_probs)[1])

    def decode_batch(self, log_probs: np.ndarray, lens, workers: int = 0) -> list[str]:
        """(T, B, 30) with valid lengths (B,) -> B texts; ``workers`` > 1 decodes on that many threads."""
        return decode_parallel(self, log_probs, lens, workers)


@register_decoder("wordbeam")
def make_wordbeam(beam: int = 256, features=None, lm=None, mode: str = "ngrams", lm_weight: float = 1.0, **kw):
    """``lm``: a BigramLM or the path of an lm.json; else the one beside ``features``.
    Beam width 1 is greedy, as for every beam decoder."""
    if beam == 1:
        return GreedyDecoder()
    if lm is None:
        if features is None:
            raise SpeechperfError("wordbeam needs a dictionary and LM: give features=FEATS or lm=")
        lm = load_lm(features)
    elif not isinstance(lm, BigramLM):
        lm = load_lm(lm)
    return WordBeamDecoder(lm, beam, mode=mode, lm_weight=lm_weight, **kw)
