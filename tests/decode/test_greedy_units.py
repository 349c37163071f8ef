"""The greedy decoder in a run's units (data/units.py): characters as before, bit for bit; BPE
read back through SentencePiece; the character-only beam decoders refuse BPE units by name."""
import numpy as np
import pytest

from speechperf.corpus import alphabet
from speechperf.data.units import CHAR_UNITS, Units, train_bpe
from speechperf.decode import DecodeError, get_decoder
from speechperf.decode.greedy import GreedyDecoder

TEXTS = ["the cool dog ran off", "a cool cat sat on the mat", "the dog sat", "a good book and a good cat"] * 3


@pytest.fixture(scope="module")
def bpe():
    return Units("bpe:60", train_bpe(TEXTS, 60))


def peaked(labels, classes, seed=0, frames=2):
    """(T, classes) log-probabilities whose best path emits ``labels``, a blank after each label."""
    path = []
    for lab in labels:
        path += [int(lab)] * frames + [0]
    x = np.random.default_rng(seed).standard_normal((len(path) + 1, classes))
    x[np.arange(len(path)), path] += 12.0
    x[-1, 0] += 12.0
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_char_units_decode_as_before():
    rng = np.random.default_rng(1)
    lp = np.log(rng.dirichlet(np.ones(30) * 0.3, size=(40, 3)))  # (T, B, 30) noisy: repeats, blanks, separators
    lens = [40, 17, 0]
    want = [alphabet.decode(alphabet.collapse(lp[:n, b].argmax(1))) for b, n in enumerate(lens)]
    for dec in (GreedyDecoder(), get_decoder("greedy"), get_decoder("greedy", units=CHAR_UNITS)):
        assert dec.decode_batch(lp, lens) == want
        assert dec.decode(lp[:, 0]) == want[0]
    assert type(get_decoder("beam", beam=4, units=CHAR_UNITS)).__name__ == "BeamDecoder"


def test_greedy_reads_bpe_labels_back(bpe):
    texts = ["the cool cat", "a good dog ran off", "tab"]
    mats = [peaked(bpe.encode(t), bpe.num_classes, seed=i) for i, t in enumerate(texts)]
    dec = get_decoder("greedy", units=bpe)
    assert [dec.decode(m) for m in mats] == texts
    T = max(len(m) for m in mats)
    batch = np.full((T, len(mats), bpe.num_classes), -50.0)
    batch[:, :, 0] = 0.0  # padding frames: blank
    for b, m in enumerate(mats):
        batch[: len(m), b] = m
    assert dec.decode_batch(batch, [len(m) for m in mats]) == texts
    with pytest.raises(DecodeError, match=r"\(T, 61\)"):
        dec.decode(peaked([1], 30))
    with pytest.raises(DecodeError, match=r"\(T, B, 61\)"):
        dec.decode_batch(peaked([1], 30)[:, None], [2])


def test_repeated_pieces_need_a_blank_between_them(bpe):
    piece = int(bpe.encode("the")[0])
    lp = peaked([piece, piece], bpe.num_classes)  # a blank between: two pieces
    assert get_decoder("greedy", units=bpe).decode(lp) == bpe.decode([piece, piece])
    merged = peaked([piece], bpe.num_classes, frames=4)  # one run of frames: one piece
    assert get_decoder("greedy", units=bpe).decode(merged) == bpe.decode([piece])


@pytest.mark.parametrize("name", ["beam", "wordbeam", "flashlight"])
def test_beam_decoders_refuse_bpe_units_and_width_one_is_greedy(bpe, name):
    with pytest.raises(DecodeError, match=rf"decoder '{name}' \(beam 8\).*'bpe:60'") as e:
        get_decoder(name, beam=8, units=bpe)
    assert e.value.exit_code == 2
    dec = get_decoder(name, beam=1, units=bpe)
    assert isinstance(dec, GreedyDecoder) and dec.units is bpe
