"""Word and character error rates (SPEC D), in percent.

WER is jiwer's corpus-level WER: (S + D + I) / N over all reference words. Two CERs are
reported and always labelled: ``cer`` (standard: character edits / reference characters)
and ``cer_paper`` (Eq. 3 of the ASR paper, edits / max(len(hyp), len(ref)), aggregated
over the set as sum of edits / sum of maxima). Character edit distance comes from
rapidfuzz, the C++ Levenshtein that jiwer itself uses.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import jiwer
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
    if len(refs) != len(hyps):
        raise SpeechperfError(f"{len(refs)} references but {len(hyps)} hypotheses")
    if not refs:
        raise SpeechperfError("no utterances to score")
    empty = [i for i, r in enumerate(refs) if not r.strip()]
    if empty:
        raise SpeechperfError(f"empty reference transcript at position {empty[0]}")
    wer = jiwer.wer(list(refs), list(hyps))
    edits = sum(Levenshtein.distance(r, h) for r, h in zip(refs, hyps))
    ref_chars = sum(len(r) for r in refs)
    max_chars = sum(max(len(r), len(h)) for r, h in zip(refs, hyps))
    return ErrorRates(
        wer=100.0 * wer,
        cer=100.0 * edits / ref_chars,
        cer_paper=100.0 * edits / max_chars,
        n_utts=len(refs),
        ref_words=sum(len(r.split()) for r in refs),
        ref_chars=ref_chars,
    )
