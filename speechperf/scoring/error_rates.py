"""Word, character and sentence error rates (docs/spec.md D; SER as Kaldi's %SER), in percent.

WER is jiwer's corpus-level WER: (S + D + I) / N over all reference words. Two CERs are
reported and always labelled: ``cer`` (standard: character edits / reference characters)
and ``cer_paper`` (Eq. 3 of the ASR paper, edits / max(len(hyp), len(ref)), aggregated
over the set as sum of edits / sum of maxima). Every rate is summed from the per-utterance
counts (:func:`utterance_errors`) that the bootstrap resamples, so a point value and its
interval come from one count. Edit distances come from rapidfuzz, the C++ Levenshtein that
jiwer itself uses: jiwer.wer gives the same WER (tests/scoring compare them) but also builds
every alignment, 6x the seconds of the distances alone (50 against 8 ms for 1,627
utterances; ledger: bench_scoring), in an evaluation the TTA clock times.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np
from rapidfuzz.distance import Levenshtein

from speechperf.errors import SpeechperfError


@dataclass(frozen=True)
class ErrorRates:
    """Error rates of a set of (reference, hypothesis) pairs, percent."""

    wer: float  # word error rate, jiwer corpus-level
    cer: float  # standard CER: edits / reference characters
    cer_paper: float  # paper CER: edits / max(hyp, ref) characters, summed over the set
    n_utts: int  # pairs scored
    ref_words: int  # N of the WER
    ref_chars: int  # denominator of the standard CER

    def to_dict(self) -> dict:
        return asdict(self)


def error_rates(refs: Sequence[str], hyps: Sequence[str]) -> ErrorRates:
    """Score hypotheses against references; empty hypotheses count as deletions."""
    return scored(refs, hyps)[0]


def scored(refs: Sequence[str], hyps: Sequence[str]) -> tuple[ErrorRates, "UtteranceErrors"]:
    """:func:`error_rates` and the per-utterance counts they are summed from (one pass)."""
    if len(refs) != len(hyps):
        raise SpeechperfError(f"{len(refs)} references but {len(hyps)} hypotheses")
    if not refs:
        raise SpeechperfError("no utterances to score")
    empty = [i for i, r in enumerate(refs) if not r.strip()]
    if empty:
        raise SpeechperfError(f"empty reference transcript at position {empty[0]}")
    u = utterance_errors(refs, hyps)
    edits, ref_chars, ref_words = int(u.char_edits.sum()), int(u.ref_chars.sum()), int(u.ref_words.sum())
    max_chars = sum(max(len(r), len(h)) for r, h in zip(refs, hyps))
    return ErrorRates(
        wer=100.0 * int(u.word_edits.sum()) / ref_words,
        cer=100.0 * edits / ref_chars,
        cer_paper=100.0 * edits / max_chars,
        n_utts=len(refs),
        ref_words=ref_words,
        ref_chars=ref_chars,
    ), u


@dataclass(frozen=True)
class UtteranceErrors:
    """Per-utterance error counts of a set of pairs, so that the set can be resampled
    (scoring/bootstrap.py); each array holds one entry per utterance, in the set's order."""

    char_edits: np.ndarray  # character edit distance (the standard CER's numerator)
    ref_chars: np.ndarray  # reference characters (its denominator)
    word_edits: np.ndarray  # word edit distance, S + D + I (the WER's numerator)
    ref_words: np.ndarray  # reference words, N (its denominator)
    sentence_errors: np.ndarray  # 1 where the hypothesis has any word error (SER's numerator, as Kaldi's %SER)
    sentences: np.ndarray  # 1 per utterance (its denominator)


def utterance_errors(refs: Sequence[str], hyps: Sequence[str]) -> UtteranceErrors:
    """The counts behind :func:`error_rates`, per utterance: their sums give its CER and WER
    (the word counts split on whitespace, as jiwer's default transform does), and the SER: an
    utterance is in error when its words differ from the reference's in any place (Kaldi's
    compute-wer, whose %SER counts sentences with any word error)."""
    ref_words = [r.split() for r in refs]
    ints = lambda values: np.fromiter(values, dtype=np.int64, count=len(refs))  # noqa: E731
    word_edits = ints(Levenshtein.distance(w, h.split()) for w, h in zip(ref_words, hyps))
    return UtteranceErrors(
        char_edits=ints(Levenshtein.distance(r, h) for r, h in zip(refs, hyps)),
        ref_chars=ints(len(r) for r in refs),
        word_edits=word_edits,
        ref_words=ints(len(w) for w in ref_words),
        sentence_errors=(word_edits > 0).astype(np.int64),
        sentences=np.ones(len(refs), dtype=np.int64),
    )
