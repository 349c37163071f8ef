import random

import jiwer
import pytest

from speechperf.errors import SpeechperfError
from speechperf.scoring.error_rates import error_rates


def test_exact_small_case():
    r = error_rates(["the cat sat", "a dog"], ["the cat sit down", ""])
    # words: sub sat->sit, ins down, del a, del dog -> 4 / 5
    assert r.wer == pytest.approx(80.0)
    # chars: "the cat sat" vs "the cat sit down": 1 sub + 5 ins = 6; "a dog" vs "": 5
    assert r.cer == pytest.approx(100.0 * 11 / 16)
    assert r.cer_paper == pytest.approx(100.0 * 11 / (16 + 5))
    assert (r.n_utts, r.ref_words, r.ref_chars) == (2, 5, 16)


def test_wer_equals_jiwer_on_random_pairs():
    rng = random.Random(3)
    words = "a an the cat dog sat on mat hat red".split()
    refs = [" ".join(rng.choices(words, k=rng.randint(1, 8))) for _ in range(50)]
    hyps = [" ".join(rng.choices(words, k=rng.randint(0, 8))) for _ in range(50)]
    r = error_rates(refs, hyps)
    assert r.wer == pytest.approx(100.0 * jiwer.wer(refs, hyps))
    assert r.cer == pytest.approx(100.0 * jiwer.cer(refs, hyps))
    assert r.cer_paper <= r.cer


def test_the_counts_give_jiwers_rates_on_decoder_like_text():
    """The rates are sums of per-utterance rapidfuzz distances (no jiwer at run time): the same
    WER and CER as jiwer's corpus-level ones on text as the decoders write it (the alphabet's
    letters, apostrophes, runs of separators, leading and trailing spaces, empty hypotheses). The
    CER counts every character as written, jiwer's after collapsing spaces: equal on the
    normalized text the decoders return."""
    rng = random.Random(11)
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ'"
    word = lambda: "".join(rng.choices(letters, k=rng.randint(1, 9)))  # noqa: E731
    refs = [" ".join(word() for _ in range(rng.randint(1, 20))) for _ in range(400)]
    hyps = []
    for r in refs:
        kept = [w if rng.random() > 0.2 else word() for w in r.split() if rng.random() > 0.1]
        hyps.append(rng.choice(["", " "]) + rng.choice([" ", "  "]).join(kept) + rng.choice(["", " "]))
    hyps[::37] = [""] * len(hyps[::37])
    r = error_rates(refs, hyps)
    assert r.wer == pytest.approx(100.0 * jiwer.wer(refs, hyps), rel=1e-12)
    normalized = [" ".join(h.split()) for h in hyps]
    assert error_rates(refs, normalized).cer == pytest.approx(100.0 * jiwer.cer(refs, normalized), rel=1e-12)
    out = jiwer.process_words(refs, hyps)
    assert r.ref_words == sum(len(x) for x in out.references)


def test_bad_inputs():
    with pytest.raises(SpeechperfError, match="2 references but 1"):
        error_rates(["a", "b"], ["a"])
    with pytest.raises(SpeechperfError, match="empty reference"):
        error_rates(["a", " "], ["a", "b"])
    with pytest.raises(SpeechperfError, match="no utterances"):
        error_rates([], [])
