"""flashlight-text's lexicon beam search decoder with a KenLM model (optional extra).

``pip install speechperf[flashlight]``. The LM is an ARPA file: the user's, or the bigram
speechperf writes beside lm.json (``speechperf lm build``). The lexicon spells every word
of the ARPA unigrams through the alphabet, separator included, so flashlight and
``wordbeam`` search the same dictionary. flashlight's token dictionary uses our indices:
0 blank, 1 space (its silence token), 2..29 letters, apostrophe, separator.
"""
from __future__ import annotations

import contextlib
import math
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from speechperf.corpus import alphabet
from speechperf.decode import check_log_probs, register_decoder
from speechperf.decode.batch import decode_parallel
from speechperf.data.lm import LM_NAME, BigramLM, LMError, load_lm, write_arpa
from speechperf.errors import SpeechperfError
from speechperf.decode.greedy import GreedyDecoder

ARPA_NAME = "lm.arpa"
TOKENS = ["<blank>", "|", *alphabet.SYMBOLS[2:]]  # flashlight needs printable, distinct tokens
SPECIAL = {"<s>", "</s>", "<unk>"}


def arpa_words(path: Path) -> list[str]:
    """The words of an ARPA file's 1-gram section (without <s>, </s>, <unk>)."""
    words, inside = [], False
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise LMError(f"cannot read ARPA file {path}: {e}") from e
    for line in lines:
        if line.startswith("\\"):
            inside = line.strip() == "\\1-grams:"
            continue
        parts = line.split()
        if inside and len(parts) >= 2 and parts[1] not in SPECIAL:
            words.append(parts[1])
    if not words:
        raise LMError(f"{path} has no 1-grams: not an ARPA language model")
    return words


class FlashlightDecoder:
    """flashlight's LexiconDecoder (CTC criterion) over the 30-symbol alphabet."""

    name = "flashlight"
    thread_safe = False  # its LexiconDecoder keeps the search's state in itself: one search at a time

    def __init__(self, arpa: Path, beam: int, lm_weight: float = 1.0, word_score: float = 0.0,
                 beam_threshold: float = 25.0):
        # KenLM scores are log10 and emissions natural logs: lm_weight * ln 10 makes weight 1
        # mean the same as in wordbeam (checked: KenLM's scores equal our bigram's / ln 10).
        from flashlight.lib.text import decoder as fl  # the optional flashlight extra
        from flashlight.lib.text.decoder.kenlm import KenLM
        from flashlight.lib.text.dictionary import Dictionary

        words = arpa_words(arpa)
        spell = {}
        for w in words:
            try:
                spell[w] = alphabet.encode(w)
            except alphabet.AlphabetError as e:
                raise LMError(f"{arpa}: word {w!r}: {e}") from None
        self.word_dict = Dictionary([*spell, "<unk>"])  # word index = position
        self.word_dict.set_default_index(self.word_dict.get_index("<unk>"))
        self.lm = KenLM(str(arpa), self.word_dict)
        trie = fl.Trie(alphabet.NUM_SYMBOLS, alphabet.SPACE)
        start = self.lm.start(False)
        for w, s in spell.items():
            idx = self.word_dict.get_index(w)
            trie.insert(s + [alphabet.SPACE], idx, self.lm.score(start, idx)[1])  # a word ends with its space
        trie.smear(fl.SmearingMode.MAX)
        opts = fl.LexiconDecoderOptions(beam_size=beam, beam_size_token=alphabet.NUM_SYMBOLS,
                                        beam_threshold=beam_threshold, lm_weight=lm_weight * math.log(10),
                                        word_score=word_score,
                                        unk_score=-math.inf, sil_score=0.0, log_add=False,
                                        criterion_type=fl.CriterionType.CTC)
        self.trie = trie  # the decoder keeps a reference only: hold it for the decoder's lifetime
        self.decoder = fl.LexiconDecoder(opts, trie, self.lm, alphabet.SPACE, alphabet.BLANK,
                                         self.word_dict.get_index("<unk>"), [], False)

    def decode(self, log_probs: np.ndarray) -> str:
        """(T, 30) log-probabilities -> words joined by single spaces."""
        check_log_probs(log_probs)
        if log_probs.shape[0] == 0:
            return ""
        em = np.ascontiguousarray(log_probs, dtype=np.float32)  # (T, 30): the layout flashlight reads
        best = self.decoder.decode(em.ctypes.data, em.shape[0], em.shape[1])[0]
        return " ".join(self.word_dict.get_entry(i) for i in best.words if i >= 0)

    def decode_batch(self, log_probs: np.ndarray, lens, workers: int = 0) -> list[str]:
        """(T, B, 30) with valid lengths (B,) -> B texts; ``workers`` > 1 decodes on that many threads."""
        return decode_parallel(self, log_probs, lens, workers)


@contextlib.contextmanager
def arpa_file(features: Path | None, lm) -> Iterator[Path]:
    """The ARPA file to load: ``lm`` if a path to one, FEATS/lm.arpa, or one written from a BigramLM
    into a temporary folder removed on exit (KenLM has read it all by then)."""
    if isinstance(lm, (str, Path)) and Path(lm).suffix != ".json":
        yield Path(lm)
    elif lm is None and features is not None:
        arpa = Path(features) / ARPA_NAME
        if not arpa.exists() or not (Path(features) / LM_NAME).exists():
            load_lm(features)  # builds lm.json and lm.arpa when missing
        yield arpa
    elif lm is None:
        raise SpeechperfError("flashlight needs an LM: give features=FEATS or lm=ARPA path / BigramLM")
    else:
        bigram = lm if isinstance(lm, BigramLM) else load_lm(lm)
        with tempfile.TemporaryDirectory(prefix="speechperf-lm-") as folder:
            write_arpa(bigram, Path(folder) / ARPA_NAME)
            yield Path(folder) / ARPA_NAME


@register_decoder("flashlight")
def make_flashlight(beam: int = 256, features=None, lm=None, lm_weight: float = 1.0, **kw):
    """Needs flashlight-text (the ``flashlight`` extra); beam width 1 is greedy."""
    try:
        import flashlight.lib.text.decoder  # noqa: F401  the optional extra: checked here
    except ImportError:
        raise SpeechperfError("the flashlight decoder needs flashlight-text: "
                              "pip install 'speechperf[flashlight]'") from None
    if beam == 1:
        return GreedyDecoder()
    with arpa_file(features, lm) as arpa:
        return FlashlightDecoder(arpa, beam, lm_weight=lm_weight, **kw)
