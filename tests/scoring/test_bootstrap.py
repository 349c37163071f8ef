"""The resolution of an evaluation: a percentile bootstrap of corpus-level CER and WER over
utterances (scoring/bootstrap.py), checked against a slow pure-Python reference."""
import jiwer
import numpy as np
import pytest

from speechperf.scoring import bootstrap
from speechperf.scoring.bootstrap import error_intervals, rate_interval, resample_indices, with_interval
from speechperf.scoring.error_rates import error_rates, utterance_errors

REFS = ["the cat sat on the mat", "a dog", "hello there general kenobi", "it is raining again today",
        "one two three four five six", "speech recognition is hard", "yes", "where is the station please"]
HYPS = ["the cat sat on a mat", "a dog", "hello their general canobi", "it raining again to day",
        "one two three for five six seven", "speech wreck ignition is hard", "", "where is the station please"]


def _percentile(values, q):
    """numpy's default (linear) percentile, in plain Python."""
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _reference(errors, lengths, indices, confidence=0.95):
    """The bootstrap one resample at a time, one utterance at a time."""
    rates = []
    for row in indices.tolist():
        rates.append(100.0 * sum(int(errors[i]) for i in row) / sum(int(lengths[i]) for i in row))
    tail = 100 * (1 - confidence) / 2
    return _percentile(rates, tail), _percentile(rates, 100 - tail)


def test_equal_rates_give_a_zero_width_interval_at_that_rate():
    # every utterance 1 error in 10 characters, of different lengths: any resample has 10%
    errors, lengths = np.array([1, 2, 3, 5, 4]), np.array([10, 20, 30, 50, 40])
    r = rate_interval(errors, lengths)
    assert r.rate == pytest.approx(10.0) and r.low == pytest.approx(10.0) and r.high == pytest.approx(10.0)


def test_the_interval_matches_a_pure_python_bootstrap_of_the_same_draws():
    u = utterance_errors(REFS, HYPS)
    idx = resample_indices(len(REFS))
    got = error_intervals(u)
    for metric, errors, lengths in (("cer", u.char_edits, u.ref_chars), ("wer", u.word_edits, u.ref_words)):
        low, high = _reference(errors, lengths, idx)
        assert (got[f"{metric}_lo"], got[f"{metric}_hi"]) == pytest.approx((low, high), rel=1e-12, abs=1e-12)
        point = getattr(error_rates(REFS, HYPS), metric)
        assert got[f"{metric}_lo"] < point < got[f"{metric}_hi"]  # mixed rates: a real width around the estimate


def test_per_utterance_counts_sum_to_the_corpus_rates():
    u, rates = utterance_errors(REFS, HYPS), error_rates(REFS, HYPS)
    assert 100 * u.char_edits.sum() / u.ref_chars.sum() == pytest.approx(rates.cer)
    assert 100 * u.word_edits.sum() / u.ref_words.sum() == pytest.approx(100 * jiwer.wer(REFS, HYPS))
    assert (u.ref_chars.sum(), u.ref_words.sum()) == (rates.ref_chars, rates.ref_words)


def test_deterministic_and_memory_bounded_chunks_draw_the_same(monkeypatch):
    refs, hyps = REFS[:7], HYPS[:7]  # odd: a chunk of 3 resamples is 21 draws, no whole number of 64-bit words
    u = utterance_errors(refs, hyps)
    first = error_intervals(u)
    assert error_intervals(u) == first
    whole = resample_indices(len(refs), 50)
    monkeypatch.setattr(bootstrap, "CHUNK_CELLS", 3 * len(refs) + 1)
    assert np.array_equal(resample_indices(len(refs), 50), whole)  # the chunks continue one generator
    assert error_intervals(u) == first


def test_a_larger_set_of_the_same_utterances_resolves_more_finely():
    u = utterance_errors(REFS, HYPS)
    wide = rate_interval(u.char_edits, u.ref_chars)
    narrow = rate_interval(np.tile(u.char_edits, 16), np.tile(u.ref_chars, 16))
    assert narrow.rate == pytest.approx(wide.rate)
    assert narrow.high - narrow.low < (wide.high - wide.low) / 2


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="no utterances"):
        rate_interval([], [])
    with pytest.raises(ValueError, match="without reference length"):
        rate_interval([1, 0], [5, 0])


def test_with_interval_text():
    assert with_interval(9.356, 8.1, 10.7) == "9.36 [8.10, 10.70]"
    assert with_interval(9.356, None, None) == "9.36" and with_interval(None, 1, 2) is None
