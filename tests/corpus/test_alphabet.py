"""The alphabet's vectorized encoder against the reference loop."""
import random

import numpy as np
import pytest

from speechperf.corpus import alphabet


def test_encode_array_equals_encode_on_random_transcripts():
    rng = random.Random(0)
    chars = " abcdefghijklmnopqrstuvwxyz'"
    texts = ["", "a", "cool", "aaa", "''", "a  b", "bookkeeper's  l"]
    texts += ["".join(rng.choice(chars[:4] if k % 2 else chars) for _ in range(rng.randint(1, 300))) for k in range(400)]
    for t in texts:
        got = alphabet.encode_array(t)
        assert got.dtype == np.int64 and got.tolist() == alphabet.encode(t), t


@pytest.mark.parametrize("text, char", [("caf\u00e9", "\u00e9"), ("a_b", "_"), ("r2d2", "2"), ("A", "A")])
def test_encode_array_refuses_what_encode_refuses_naming_the_character(text, char):
    with pytest.raises(alphabet.AlphabetError, match=repr(char)):
        alphabet.encode_array(text)
