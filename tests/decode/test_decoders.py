import importlib.util
import itertools
import json

import numpy as np
import pytest

from speechperf.corpus import alphabet
from speechperf.decode import get_decoder
from speechperf.decode.beam import prefix_beam_search
from speechperf.data.lm import BigramLM, LMError, build_lm_for_features, count, load_lm
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
    assert prefix_beam_search(lp, beam=10_000, prune=0, gap=np.inf) == exhaustive(lp)


def _single_spaced(labels, space=1):
    """Label sequence with leading spaces dropped and runs of spaces made one."""
    out = []
    for lab in labels:
        if lab == space and (not out or out[-1] == space):
            continue
        out.append(lab)
    return tuple(out)


@pytest.mark.parametrize("seed", range(8))
def test_prefix_beam_with_space_merging_equals_exhaustive_search_over_single_spaced_texts(seed):
    # symbol 1 plays the space: mass of texts that differ only in runs of spaces is summed
    lp = log_softmax(np.random.default_rng(100 + seed).standard_normal((5, 4)) * 2)
    T, C = lp.shape
    scores = {}
    for path in itertools.product(range(C), repeat=T):
        labels = _single_spaced(alphabet.collapse(path))
        scores[labels] = np.logaddexp(scores.get(labels, -np.inf), sum(lp[t, c] for t, c in enumerate(path)))
    assert prefix_beam_search(lp, beam=10_000, prune=0, gap=np.inf, space=1) == max(scores, key=scores.get)


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
    (split / "index.json").write_text(json.dumps({"shards": {}, "utterances": [{"transcript": t} for t in TEXTS]}))
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
    (split / "index.json").write_text(json.dumps({"shards": {}, "utterances": [{"transcript": "caf\u00e9 ole"}]}))
    with pytest.raises(LMError, match="caf"):
        build_lm_for_features(tmp_path)


def reference_prefix_beam(lp, beam):
    """Plain-Python prefix beam search (dict of prefixes, full sort), no pruning."""
    beams = {(): (0.0, -np.inf)}
    for frame in lp:
        nxt = {}
        for prefix, (pb, pnb) in beams.items():
            total = np.logaddexp(pb, pnb)
            e = nxt.setdefault(prefix, [-np.inf, -np.inf])
            e[0] = np.logaddexp(e[0], total + frame[0])
            if prefix:
                e[1] = np.logaddexp(e[1], pnb + frame[prefix[-1]])
            for c in range(1, len(frame)):
                x = nxt.setdefault(prefix + (c,), [-np.inf, -np.inf])
                x[1] = np.logaddexp(x[1], (pb if prefix and c == prefix[-1] else total) + frame[c])
        beams = dict(sorted(nxt.items(), key=lambda kv: -np.logaddexp(*kv[1]))[:beam])
    return max(beams, key=lambda k: np.logaddexp(*beams[k]))


@pytest.mark.parametrize("beam", [2, 8])
def test_compiled_beam_equals_python_reference(beam):
    for seed in range(4):
        lp = log_softmax(np.random.default_rng(seed).standard_normal((30, 6)) * 2)
        assert prefix_beam_search(lp, beam, prune=0, gap=np.inf) == reference_prefix_beam(lp, beam)


def test_get_decoder_options_and_width_one(tmp_path):
    lm = lm_of()
    dec = get_decoder("wordbeam", beam=8, lm=lm, mode="ngrams_forecast")
    assert isinstance(dec, WordBeamDecoder) and dec.mode == "ngrams_forecast"
    assert type(get_decoder("wordbeam", beam=1, lm=lm)).__name__ == "GreedyDecoder"
    assert type(get_decoder("beam", beam=1)).__name__ == "GreedyDecoder"
    with pytest.raises(SpeechperfError, match="needs a dictionary"):
        get_decoder("wordbeam", beam=4)


def test_separator_and_apostrophe_between_words():
    lm = lm_of()
    # "the_cat": the separator stands where the space should be; "'" likewise
    for gap in (alphabet.SEPARATOR, alphabet.CHAR_TO_INDEX["'"]):
        labels = alphabet.encode("the") + [gap] + alphabet.encode("cat")
        lp = log_softmax(np.eye(30)[sum(([lab, lab, 0] for lab in labels), [])] * 9.0)
        assert WordBeamDecoder(lm, beam=8).decode(lp) == "the cat"
    lp = spell("a good book")  # doubled letters inside words keep their separator
    assert WordBeamDecoder(lm, beam=8).search(lp)[0] == alphabet.encode("a good book")


def test_forecast_sample_is_deterministic_and_words_sorted_by_labels():
    lm = lm_of()
    lp = spell("the cot dug rn", noise=1.5, seed=3)
    d = WordBeamDecoder(lm, beam=16, mode="ngrams_forecast_sample", samples=2)
    assert d.decode(lp) == d.decode(lp)
    from speechperf.decode.search_tables import tree_order

    assert tree_order(["cool", "coo", "col"]) == ["col", "coo", "cool"]  # c o l < c o o < c o _ o l
    with pytest.raises(LMError, match="caf"):
        tree_order(["caf\u00e9"])


def test_log_prob_checks():
    dec = get_decoder("beam", beam=4)
    with pytest.raises(SpeechperfError, match=r"\(T, 30\)"):
        dec.decode(np.zeros((5, 29)))
    with pytest.raises(SpeechperfError, match="NaN"):
        dec.decode(np.full((5, 30), np.nan))
    with pytest.raises(SpeechperfError, match="logits"):
        dec.decode(np.ones((5, 30)))
    with pytest.raises(SpeechperfError, match="beam width"):
        get_decoder("wordbeam", beam=0, lm=lm_of())
    with pytest.raises(SpeechperfError, match="float"):
        dec.decode(np.zeros((5, 30), dtype=np.int64))


def test_decode_batch_in_worker_processes_matches_serial():
    lm = lm_of()
    mats = [spell(t, noise=1.0, seed=i) for i, t in enumerate(TEXTS)]
    T = max(len(m) for m in mats)
    batch = np.full((T, len(mats), 30), np.log(1e-6))  # (T, B, C) padded
    for b, m in enumerate(mats):
        batch[: len(m), b] = m
    lens = [len(m) for m in mats]
    for dec in (get_decoder("beam", beam=8), WordBeamDecoder(lm, beam=8)):
        assert dec.decode_batch(batch, lens, workers=2) == dec.decode_batch(batch, lens) == [dec.decode(m) for m in mats]


def test_lm_file_from_another_alphabet_is_rejected(tmp_path):
    import hashlib

    body = {"alphabet": ["", " ", "a"], "discount": 0.75, "splits": ["train"], "unigrams": {"a": 1}, "bigrams": {}}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    (tmp_path / "lm.json").write_text(json.dumps({**body, "sha256": digest}))
    with pytest.raises(LMError, match="alphabet"):
        load_lm(tmp_path / "lm.json")


def test_flashlight_agrees_on_peaked_matrices(tmp_path):
    pytest.importorskip("flashlight.lib.text.decoder")
    from speechperf.decode.flashlight import arpa_words
    from speechperf.data.lm import write_arpa

    write_arpa(lm_of(), tmp_path / "lm.arpa")
    assert sorted(arpa_words(tmp_path / "lm.arpa")) == lm_of().words
    dec = get_decoder("flashlight", beam=16, lm=tmp_path / "lm.arpa")
    for text in ["the cool dog ran", "a good book"]:
        assert dec.decode(spell(text)) == text
    (tmp_path / "bad.arpa").write_text("hello\n")
    with pytest.raises(LMError, match="bad.arpa"):
        get_decoder("flashlight", beam=16, lm=tmp_path / "bad.arpa")


def test_an_lm_object_is_written_to_an_arpa_file_that_is_removed_after(tmp_path, monkeypatch):
    """flashlight loads ARPA files: a BigramLM given in memory is written to a temporary one,
    read whole by KenLM at construction, then removed (not one folder left per decoder)."""
    import tempfile

    from speechperf.decode.flashlight import arpa_file, arpa_words

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with arpa_file(None, lm_of()) as arpa:
        assert sorted(arpa_words(arpa)) == lm_of().words
    assert not arpa.exists() and list(tmp_path.iterdir()) == []
    with arpa_file(None, tmp_path / "user.arpa") as given:  # the user's file: named as it is, kept
        assert given == tmp_path / "user.arpa"
    if importlib.util.find_spec("flashlight") is not None:
        dec = get_decoder("flashlight", beam=16, lm=lm_of())
        assert dec.decode(spell("a good book")) == "a good book" and list(tmp_path.iterdir()) == []


def test_lm_build_errors_name_the_folder(tmp_path):
    with pytest.raises(LMError, match="nosuch"):
        build_lm_for_features(tmp_path / "nosuch")
    with pytest.raises(LMError, match="no prepared train"):
        build_lm_for_features(tmp_path)
    (tmp_path / "train-x").mkdir()
    (tmp_path / "train-x" / "index.json").write_text(json.dumps({"shards": {}, "utterances": [{"id": "u1"}]}))
    with pytest.raises(LMError, match="transcript"):
        build_lm_for_features(tmp_path)
