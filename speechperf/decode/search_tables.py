"""Flat numpy tables of the dictionary prefix tree and the bigram LM for the search kernel.

Words are numbered in the order of their label sequences (``alphabet.encode``, so a doubled
letter carries the separator: ``cool`` = c o _ o l). Inserting them in that order makes the
words below any tree node a contiguous id range ``[lo, hi)``, so the LM mass of every word a
partial word can still become (the forecast modes) is two prefix-sum differences instead
of a sum over the words.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from speechperf.corpus import alphabet
from speechperf.data.lm import DISCOUNT, START, BigramLM, LMError

# Characters that may stand between words: the space, and the apostrophe and separator
# where they are not part of a dictionary word (a tree child wins over a non-word reading).
NON_WORD_LABELS = (alphabet.SPACE, alphabet.CHAR_TO_INDEX["'"], alphabet.SEPARATOR)


@dataclass(frozen=True)
class SearchTables:
    """Everything the word beam search kernel reads; built once per LM."""

    words: tuple[str, ...]  # word id -> text, in label-sequence order
    next_node: np.ndarray  # (nodes, C) int32: child node per label, -1 where none; node 0 = root
    node_word: np.ndarray  # (nodes,) int32: id of the word ending at the node, -1 if none
    node_lo: np.ndarray  # (nodes,) int32: first word id below the node
    node_hi: np.ndarray  # (nodes,) int32: one past the last word id below the node
    non_word: np.ndarray  # (k,) int32: labels allowed between words
    uni: np.ndarray  # (V,) float64: smoothed unigram P_uni(w)
    cum_uni: np.ndarray  # (V + 1,) float64: prefix sums of uni
    row_start: np.ndarray  # (V + 2,) int64: CSR rows per history (V = <s>)
    row_word: np.ndarray  # (nnz,) int32: seen successor ids, ascending within a row
    row_disc: np.ndarray  # (nnz,) float64: max(c(v, w) - D, 0) / c(v)
    cum_disc: np.ndarray  # (nnz + 1,) float64: prefix sums of row_disc
    backoff: np.ndarray  # (V + 1,) float64: unigram weight D * N1+(v) / c(v), 1 for unseen v


def tree_order(words) -> list[str]:
    """Words sorted by label sequence; a word outside the alphabet is an LMError naming it."""
    keyed = []
    for w in words:
        try:
            keyed.append((alphabet.encode(w), w))
        except alphabet.AlphabetError as e:
            raise LMError(f"dictionary word {w!r}: {e}") from None
        if not w:
            raise LMError("the dictionary holds an empty word")
    return [w for _, w in sorted(keyed)]


def build_tree(words: list[str]) -> tuple[np.ndarray, ...]:
    """(next_node, node_word, node_lo, node_hi) for ``words`` already in tree order."""
    nxt: list[list[int]] = [[-1] * alphabet.NUM_SYMBOLS]
    word, lo, hi = [-1], [0], [0]
    for wid, w in enumerate(words):
        node = 0
        hi[0] = wid + 1
        for lab in alphabet.encode(w):
            child = nxt[node][lab]
            if child < 0:
                child = nxt[node][lab] = len(nxt)
                nxt.append([-1] * alphabet.NUM_SYMBOLS)
                word.append(-1)
                lo.append(wid)
                hi.append(wid)
            node = child
            hi[node] = wid + 1
        word[node] = wid
    as32 = lambda a: np.asarray(a, dtype=np.int32)  # noqa: E731
    return as32(nxt), as32(word), as32(lo), as32(hi)


def build_tables(lm: BigramLM) -> SearchTables:
    """Tree and LM tables of ``lm``'s vocabulary (the dictionary is the LM's word list)."""
    words = tree_order(lm.words)
    tid = {w: i for i, w in enumerate(words)}
    uni = lm.uni[[lm.index[w] for w in words]].astype(np.float64)  # (V,) in tree order
    histories = words + [START]
    starts, succ, disc, back = [0], [], [], []
    for h in histories:
        follow = lm.bigrams.get(h) or {}
        total = sum(follow.values())
        for w in sorted(follow, key=tid.__getitem__):
            succ.append(tid[w])
            disc.append(max(follow[w] - DISCOUNT, 0.0) / total)
        starts.append(len(succ))
        back.append(DISCOUNT * len(follow) / total if follow else 1.0)
    nxt, node_word, lo, hi = build_tree(words)
    disc_a = np.asarray(disc, dtype=np.float64)
    return SearchTables(
        words=tuple(words), next_node=nxt, node_word=node_word, node_lo=lo, node_hi=hi,
        non_word=np.asarray(NON_WORD_LABELS, dtype=np.int32), uni=uni,
        cum_uni=np.concatenate([[0.0], np.cumsum(uni)]), row_start=np.asarray(starts, dtype=np.int64),
        row_word=np.asarray(succ, dtype=np.int32), row_disc=disc_a,
        cum_disc=np.concatenate([[0.0], np.cumsum(disc_a)]), backoff=np.asarray(back, dtype=np.float64))
