import itertools
import json

import numpy as np
import pytest

from speechperf.data import alphabet
from speechperf.decode import get_decoder
from speechperf.decode.beam import prefix_beam_search
from speechperf.decode.lm import BigramLM, LMError, build_lm_for_features, count, load_lm
from speechperf.decode.wordbeam import MODES, WordBeamDecoder
from speechperf.errors import SpeechperfError

TEXTS = ["the cool dog ran", "a cool cat sat", "the dog sat on the mat", "a good book", "the cat ran off"]


def lm_of(texts=TEXTS) -> BigramLM:
    uni, bi = count(texts)
    return BigramLM(dict(uni), {k: dict(v) for k, v in bi.items()})


def log_softmax(x):
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def spell(text: str, noise: float = 0.0, seed: int = 0, frames_per_label: int = 2) -> np.ndarray:
    """A peaked (T, 30) matrix whose best path spells ``text`` (blanks between labels)."""
    rng = np.random.default_rng(seed)
    path = []
    for lab in alphabet.encode(text):
        path += [lab] * frames_per_label + [alphabet.BLANK]
    x = rng.standard_normal((len(path) + 1, alphabet.NUM_SYMBOLS)) * noise
    x[np.arange(len(path)), path] += 8.0
    x[-1, alphabet.BLANK] += 8.0
    return log_softmax(x)


def exhaustive(lp):
    T, C = lp.shape
    scores = {}
    for path in itertools.product(range(C), repeat=T):
        labels = tuple(alphabet.collapse(path))
        s = sum(lp[t, c] for t, c in enumerate(path))
        scores[labels] = np.logaddexp(scores.get(labels, -np.inf), s)
    return max(scores, key=scores.get)


@pytest.mark.parametrize("seed", range(12))
def test_prefix_beam_equals_exhaustive_search(seed):
    lp = log_softmax(np.random.default_rng(seed).standard_normal((5, 4)) * 2)
    assert prefix_beam_search(lp, beam=10_000, prune=0) == exhaustive(lp)


def test_greedy_is_argmax_collapse():
    lp = log_softmax(np.random.default_rng(1).standard_normal((50, 30)) * 3)
    want = alphabet.decode(alphabet.collapse(lp.argmax(1)))
    assert get_decoder("greedy").decode(lp) == want
    batch = np.stack([lp, lp[::-1]], axis=1)  # (T, 2, C)
    assert get_decoder("greedy").decode_batch(batch, [50, 20]) == [want, alphabet.decode(alphabet.collapse(lp[::-1][:20].argmax(1)))]


@pytest.mark.parametrize("text", ["the cool dog ran", "a good book", "the cat sat on the mat"])
def test_all_decoders_agree_with_greedy_on_peaked_matrices(text):
    lp = spell(text)
    assert get_decoder("greedy").decode(lp) == text
    assert get_decoder("beam", beam=8).decode(lp) == text
    for mode in MODES:
        assert WordBeamDecoder(lm_of(), beam=8, mode=mode).decode(lp) == text


def test_separator_spells_doubled_letters():
    assert alphabet.encode("cool")[1:4] == [alphabet.CHAR_TO_INDEX["o"], alphabet.SEPARATOR, alphabet.CHAR_TO_INDEX["o"]]
    lp = spell("cool")
    assert get_decoder("greedy").decode(lp) == "cool"
    assert WordBeamDecoder(lm_of(), beam=4).decode(lp) == "cool"


def test_wordbeam_emits_only_dictionary_words():
    lm = lm_of()
    vocab = set(lm.words)
    for seed in range(5):
        lp = spell("the cot dug rn", noise=1.5, seed=seed)  # misspelled, noisy
        for mode in MODES:
            out = WordBeamDecoder(lm, beam=16, mode=mode).decode(lp)
            assert set(out.split()) <= vocab, (mode, out)


def test_lm_probabilities_sum_to_one():
    lm = lm_of()
    for prev in ["<s>", "the", "cool", "mat", "unseen"]:
        assert lm.row(prev).sum() == pytest.approx(1.0)
    assert lm.logprob("dog", "the") > lm.logprob("book", "the")


def test_bad_inputs():
    with pytest.raises(SpeechperfError, match="beam width"):
        get_decoder("beam", beam=0)
    with pytest.raises(SpeechperfError, match="unknown decoder"):
        get_decoder("nosuch")
    with pytest.raises(SpeechperfError, match="mode"):
        WordBeamDecoder(lm_of(), beam=4, mode="sentences")
    blank = log_softmax(np.where(np.arange(30) == 0, 10.0, 0.0)[None].repeat(20, 0))
    assert get_decoder("beam", beam=4).decode(blank) == ""
    assert WordBeamDecoder(lm_of(), beam=4).decode(blank) == ""
    assert get_decoder("beam", beam=4).decode(np.zeros((0, 30))) == ""
    # T shorter than the label: the best that fits is returned, no error
    short = spell("the cool dog ran", frames_per_label=1)[:6]
    assert len(get_decoder("beam", beam=4).decode(short)) <= 6


def test_lm_build_load_and_corruption(tmp_path):
    split = tmp_path / "train-clean"
    split.mkdir()
    (split / "index.json").write_text(json.dumps({"utterances": [{"transcript": t} for t in TEXTS]}))
    row = build_lm_for_features(tmp_path)
    assert row["words"] == len(set(" ".join(TEXTS).split()))
    assert load_lm(tmp_path).words == lm_of().words
    assert (tmp_path / "lm.arpa").read_text().startswith("\\data\\")
    data = json.loads((tmp_path / "lm.json").read_text())
    data["unigrams"]["dog"] += 1
    (tmp_path / "lm.json").write_text(json.dumps(data))
    with pytest.raises(LMError, match="checksum"):
        load_lm(tmp_path)
    (tmp_path / "lm.json").write_text("{not json")
    with pytest.raises(LMError, match="lm.json"):
        load_lm(tmp_path)
    (split / "index.json").write_text(json.dumps({"utterances": [{"transcript": "caf\u00e9 ole"}]}))
    with pytest.raises(LMError, match="caf"):
        build_lm_for_features(tmp_path)
