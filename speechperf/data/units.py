"""A run's output units: the 30-symbol characters (``"char"``) or SentencePiece BPE (``"bpe:N"``).

The units turn a transcript into the labels a model is trained on and the labels a decoder
finds back into text. Label 0 is the CTC blank for both: characters are the alphabet's indices
(corpus/alphabet.py, 30 classes); a BPE model of N pieces gives classes 1..N (its ids shifted
by one), N + 1 classes in all.

A BPE model belongs to a prepared features folder: ``FEATS/units/bpe-N.model`` (SentencePiece's
own file) beside ``FEATS/units/bpe-N.json`` (the model's sha256, the training splits and the
sha256 of their transcripts, the sentencepiece version and the training options). It is
trained once, from the training splits' transcripts, by ``prepare --units bpe:N`` or by the
first run that asks for it (:func:`ensure_units`), under a lock: a second process waits and
reads the same file. Training is deterministic: one thread (SentencePiece records the thread
count in the model, its only trace of the machine), a fixed seed, every sentence in index
order, so the same transcripts give the same bytes on any machine. Loading
(:func:`load_units`: the loader's readers, evaluation) never trains, and refuses a model whose
sha256 is not its record's.
"""
from __future__ import annotations

import fcntl
import hashlib
import io
import json
import re
import sys
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch

from speechperf.atomic import atomic_write_bytes, atomic_write_text
from speechperf.corpus import alphabet
from speechperf.data import index as index_mod
from speechperf.errors import SpeechperfError
from speechperf.features.stats import recorded_splits

CHAR = "char"
UNITS_DIR = "units"
_SPEC = re.compile(r"bpe:([0-9]+)")
MIN_BPE = len(alphabet.TEXT_CHARS) + 1  # 29: the pieces hold the 27 characters, the word boundary and <unk>
MAX_BPE = 32_000  # labels are int16 in the resident buffer (data/resident.py)
SEED = 0  # SentencePiece's random generator (BPE draws nothing with these options; fixed regardless)
# SentencePiece's trainer options (recorded in each bpe-N.json): BPE over the alphabet's
# characters only, no begin/end symbols (CTC and the transducer need none), the unknown piece
# kept at id 0 as SentencePiece requires (never produced: every character is a required one),
# no normalization (transcripts are normalized already), every sentence in index order, none
# cut for length (a LibriSpeech transcript reaches ~1,700 bytes, SentencePiece's default cut is 4,192).
OPTIONS = {"model_type": "bpe", "character_coverage": 1.0,
           "required_chars": "".join(sorted(alphabet.TEXT_CHARS - {" "})),
           "bos_id": -1, "eos_id": -1, "pad_id": -1, "unk_id": 0, "normalization_rule_name": "identity",
           "input_sentence_size": 0, "shuffle_input_sentence": False, "max_sentence_length": 1 << 20,
           "num_threads": 1}
_TOO_HIGH = re.compile(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)")


class UnitsError(SpeechperfError, ValueError):
    """A units spec that names no units, a BPE model file missing, damaged or not its record's, or a
    vocabulary the training transcripts cannot fill (exit 2, nothing written)."""


def parse_spec(spec: str, field: str = "loader.units") -> tuple[str, int]:
    """``"char"`` -> ("char", 0); ``"bpe:N"`` -> ("bpe", N); anything else raises UnitsError naming
    ``field=spec``."""
    problem = spec_problem(spec, field)
    if problem:
        raise UnitsError(problem)
    return (CHAR, 0) if spec == CHAR else ("bpe", int(_SPEC.fullmatch(spec).group(1)))


def spec_problem(spec, field: str = "loader.units") -> str | None:
    """What is wrong with ``spec`` as a units spec, naming ``field=value``; None when nothing is."""
    if spec == CHAR:
        return None
    m = _SPEC.fullmatch(spec) if isinstance(spec, str) else None
    if m is None:
        return f"{field}={spec!r} must be 'char' or 'bpe:N' (SentencePiece BPE of N pieces, e.g. 'bpe:500')"
    if not MIN_BPE <= int(m.group(1)) <= MAX_BPE:
        return (f"{field}={spec!r}: N must be {MIN_BPE}..{MAX_BPE} (the pieces hold the {MIN_BPE - 2} characters, the "
                "word boundary and <unk>)")
    return None


def num_classes_of(spec: str) -> int:
    """The model outputs ``spec``'s units need, blank included (30 for characters, N + 1 for bpe:N),
    known without the model file."""
    kind, size = parse_spec(spec)
    return alphabet.NUM_SYMBOLS if kind == CHAR else size + 1


def ctc_min_frames(labels, label_lens):
    """The fewest frames a CTC alignment of each label sequence needs: its length plus one blank per
    adjacent repeated label. ``labels`` (sum L,) concatenated, ``label_lens`` (B,) -> (B,) int64,
    a torch tensor on the labels' device for torch input, else a numpy array. Characters never
    repeat (the separator splits doubled letters), so for them it is the length."""
    as_numpy = not isinstance(labels, torch.Tensor)
    labels = torch.as_tensor(np.asarray(labels) if as_numpy else labels).reshape(-1)  # (sum L,)
    lens = torch.as_tensor(np.asarray(label_lens) if as_numpy else label_lens, device=labels.device).long()
    ends = torch.cumsum(lens, 0)  # (B,)
    starts = ends - lens
    repeat = torch.zeros(len(labels), dtype=torch.int64, device=labels.device)  # (sum L,): 1 where p repeats p - 1
    if len(labels) > 1:
        repeat[1:] = (labels[1:] == labels[:-1]).long()
    repeat[starts[(lens > 0) & (starts < len(labels))]] = 0  # an utterance's first label repeats nothing
    csum = torch.cat([repeat.new_zeros(1), torch.cumsum(repeat, 0)])  # (sum L + 1,)
    out = lens + csum[ends] - csum[starts]
    return out.cpu().numpy() if as_numpy else out


class Units:
    """The output units of a run: ``name`` ("char", "bpe500"), ``spec`` ("char", "bpe:500"),
    ``num_classes`` (blank included), ``sha256`` of the model file (None for characters),
    ``encode(text) -> (L,) int64 labels``, ``decode(labels) -> text`` and :func:`ctc_min_frames`."""

    def __init__(self, spec: str = CHAR, model: bytes | None = None, path: Path | None = None,
                 record: dict | None = None):
        kind, size = parse_spec(spec)
        self.spec, self.path = spec, path
        self.record = record  # the model's FEATS/units/bpe-N.json: splits, transcripts' sha256, options
        self.name = CHAR if kind == CHAR else f"bpe{size}"
        self.num_classes = num_classes_of(spec)
        self.model = model  # the SentencePiece model's bytes (None for characters)
        self.sha256 = None if model is None else hashlib.sha256(model).hexdigest()
        self._sp = None if model is None else _processor(model)
        if self._sp is not None and self._sp.get_piece_size() != size:
            raise UnitsError(f"{path or 'the BPE model'} holds {self._sp.get_piece_size()} pieces, not the {size} "
                             f"of {spec!r}: train it again (remove it and its .json)")

    @property
    def is_char(self) -> bool:
        return self._sp is None

    def encode(self, text: str) -> np.ndarray:
        """Normalized text -> (L,) int64 labels (characters: ``alphabet.encode_array``, bit for bit);
        AlphabetError names a character outside the alphabet."""
        if self._sp is None:
            return alphabet.encode_array(text)
        bad = sorted(set(text) - alphabet.TEXT_CHARS)
        if bad:
            raise alphabet.AlphabetError(f"character {bad[0]!r} is not in the alphabet")
        return np.asarray(self._sp.encode(text), dtype=np.int64) + 1  # (L,) 0 stays the blank

    def decode(self, labels) -> str:
        """Labels (CTC-collapsed; blanks dropped) -> text (characters: ``alphabet.decode``)."""
        if self._sp is None:
            return alphabet.decode(labels)
        return self._sp.decode([int(i) - 1 for i in labels if int(i) != alphabet.BLANK])

    collapse = staticmethod(alphabet.collapse)  # a frame-level CTC path -> labels: repeats merged, blanks dropped
    ctc_min_frames = staticmethod(ctc_min_frames)

    def describe(self) -> dict:
        """What a run records of its units."""
        return {"units": self.spec, "num_classes": self.num_classes, "sha256": self.sha256}

    def __getstate__(self) -> dict:  # a reader process started by spawn gets the bytes, not a processor
        return {"spec": self.spec, "model": self.model, "path": self.path, "record": self.record}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["spec"], state["model"], state["path"], state["record"])

    def __repr__(self) -> str:
        return f"Units({self.spec!r}, {self.num_classes} classes{'' if self.is_char else f', {self.sha256[:12]}'})"


CHAR_UNITS = Units(CHAR)


def _processor(model: bytes) -> spm.SentencePieceProcessor:
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(model)
    return sp


def paths(feats: Path, spec: str) -> tuple[Path, Path]:
    """(model, record) files of BPE units ``spec`` in the features folder ``feats``."""
    _, size = parse_spec(spec)
    base = Path(feats) / UNITS_DIR / f"bpe-{size}"
    return base.with_suffix(".model"), base.with_suffix(".json")


def load_units(feats: Path | None, spec: str) -> Units:
    """The units ``spec`` of the features folder ``feats``, read, never trained (a reader, an
    evaluation): characters need no file; a BPE model missing, unreadable or whose sha256 is not
    its record's raises UnitsError naming the file."""
    if parse_spec(spec)[0] == CHAR:
        return CHAR_UNITS
    found = _read(Path(feats), spec)
    if found is None:
        model, record = paths(feats, spec)
        raise UnitsError(f"{model if record.exists() else record} is missing: the units {spec!r} are trained "
                         f"by `speechperf prepare CORPUS {feats} --units {spec}` or by the first run that uses them")
    return found


def _read(feats: Path, spec: str) -> Units | None:
    """The stored units ``spec``, checked against their record; None when no record is (a model
    without its record is a write that did not finish)."""
    model_path, record_path = paths(feats, spec)
    if not record_path.exists():
        return None
    try:
        record = json.loads(record_path.read_text())
        want = record["sha256"]
        model = model_path.read_bytes()
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UnitsError(f"{record_path if not isinstance(e, OSError) else model_path} cannot be read "
                         f"({type(e).__name__}: {e}): remove {model_path.name} and {record_path.name} to train them "
                         "again") from e
    got = hashlib.sha256(model).hexdigest()
    if got != want:
        raise UnitsError(f"{model_path} has sha256 {got}, but {record_path} records {want}: the model is not the "
                         f"one trained for this folder (remove both files to train it again)")
    return Units(spec, model, model_path, record)


def ensure_units(feats: Path, spec: str, splits: list[str]) -> Units:
    """The units ``spec`` of ``feats``, trained first from the transcripts of the training
    ``splits`` when the folder has none: one process trains under a lock on
    ``FEATS/units/.bpe-N.lock``, another waits and reads its file. Characters: no file."""
    if parse_spec(spec)[0] == CHAR:
        return CHAR_UNITS
    feats = Path(feats)
    found = _read(feats, spec)
    if found is not None:
        return found
    model_path, record_path = paths(feats, spec)
    try:
        model_path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(model_path.parent / f".{model_path.stem}.lock", "a")
    except OSError as e:
        raise UnitsError(f"{model_path.parent} cannot be written ({e.strerror or e}): the units {spec!r} are "
                         "trained into the features folder; train them where it can be written, "
                         f"`speechperf prepare CORPUS {feats} --units {spec}`") from e
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        found = _read(feats, spec)  # trained by the process that held the lock before
        if found is not None:
            return found
        texts = _transcripts(feats, splits)
        model = train_bpe(texts, parse_spec(spec)[1])
        record = {"units": spec, "sha256": hashlib.sha256(model).hexdigest(), "splits": list(splits),
                  "utterances": len(texts), "transcripts_sha256": transcripts_sha256(texts),
                  "sentencepiece": spm.__version__, "seed": SEED, "options": OPTIONS}
        atomic_write_bytes(model_path, model)
        atomic_write_text(record_path, json.dumps(record, indent=1))  # last: the record says the model is whole
    return Units(spec, model, model_path, record)


def _transcripts(feats: Path, splits: list[str]) -> list[str]:
    """The training ``splits``' transcripts in index order (splits in the order given)."""
    if not splits:
        raise UnitsError(f"BPE units are trained from training splits, and none were given for {feats}")
    ix = index_mod.load(feats, list(splits))
    return [ix.transcript(u) for u in range(len(ix))]


def transcripts_sha256(texts: list[str]) -> str:
    """sha256 of the transcripts, one a line, in order: what a model was trained from."""
    return hashlib.sha256("".join(f"{t}\n" for t in texts).encode()).hexdigest()


def train_bpe(texts: list[str], size: int, threads: int = 1) -> bytes:
    """A SentencePiece BPE model of ``size`` pieces trained on ``texts`` (:data:`OPTIONS`), as bytes.
    ``threads`` other than 1 gives the same pieces and scores but other bytes (the model records
    the count); stored models use 1. A size the texts cannot fill raises UnitsError naming it."""
    out = io.BytesIO()
    spm.set_random_generator_seed(SEED)
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=out, vocab_size=size,
                                       minloglevel=2, **{**OPTIONS, "num_threads": threads})
    except RuntimeError as e:
        raise UnitsError(_train_failed(str(e), texts, size)) from None
    return out.getvalue()


def _train_failed(message: str, texts: list[str], size: int) -> str:
    """The one-line error for a failed training of ``size`` pieces on ``texts``."""
    words = sum(len(t.split()) for t in texts)
    corpus = (f"{len(texts):,} transcripts, {sum(map(len, texts)):,} characters, {words:,} words, "
              f"{len(set(w for t in texts for w in t.split())):,} distinct")
    too_high = _TOO_HIGH.search(message)
    if too_high:
        return (f"units 'bpe:{size}': the training transcripts ({corpus}) cannot fill {size} BPE pieces; the "
                f"largest size they fill is {too_high.group(1)} (bpe:{too_high.group(1)})")
    return f"units 'bpe:{size}': SentencePiece could not train on the training transcripts ({corpus}): " + \
        message.split("] ", 1)[-1]


def prepare_units(feats: Path, specs: list[str], quiet: bool = False) -> list[Units]:
    """``prepare --units``: each of ``specs`` trained (where the folder lacks it) from the folder's
    training splits, the ones its statistics cover (``FEATS/stats.json``'s ``splits``); a line each
    on stderr unless ``quiet``."""
    made = []
    for spec in specs:
        if parse_spec(spec)[0] == CHAR:
            continue
        splits = recorded_splits(Path(feats))
        if not splits:
            raise UnitsError(f"{Path(feats) / 'stats.json'} is missing: BPE units are trained from the training "
                             "splits it names; prepare a train* split first")
        units = ensure_units(feats, spec, splits)
        made.append(units)
        if not quiet:
            print(f"prepare: {units.path} ({spec}, {units.num_classes} classes, sha256 {units.sha256[:12]}) "
                  f"from {', '.join(units.record['splits'])}", file=sys.stderr)
    return made
