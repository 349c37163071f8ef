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


def test_bad_inputs():
    with pytest.raises(SpeechperfError, match="2 references but 1"):
        error_rates(["a", "b"], ["a"])
    with pytest.raises(SpeechperfError, match="empty reference"):
        error_rates(["a", " "], ["a", "b"])
    with pytest.raises(SpeechperfError, match="no utterances"):
        error_rates([], [])
