"""Output units (data/units.py): characters exactly as the alphabet, SentencePiece BPE trained
deterministically beside the features, checked by sha256, and the labels the loader makes."""
import hashlib
import json
import pickle
import shutil
import threading

import numpy as np
import pytest
import sentencepiece as spm
import torch
import torch.nn.functional as F

from speechperf.corpus import alphabet
from speechperf.data import units as units_mod
from speechperf.data.index import load as load_index
from speechperf.data.loader import make_loader
from speechperf.data.loader_config import LoaderConfig
from speechperf.data.resident import Resident, feature_dims, label_dtype
from speechperf.data.units import CHAR_UNITS, UnitsError, ctc_min_frames, ensure_units, load_units, paths

SPLITS = ["train-clean", "train-other"]
ALL_SPLITS = SPLITS + ["dev-clean", "dev-other", "test-clean", "test-other"]
SPEC = "bpe:100"


@pytest.fixture(scope="module")
def bpe_feats(tiny_features, tmp_path_factory):
    """A copy of the tiny features with bpe:100 trained into it (the shared folder is only read)."""
    out = tmp_path_factory.mktemp("units") / "feats"
    shutil.copytree(tiny_features, out)
    ensure_units(out, SPEC, SPLITS)
    return out


def texts_of(feats, splits):
    ix = load_index(feats, splits)
    return [ix.transcript(u) for u in range(len(ix))]


def index_only_copy(src, dst):
    """The index files and statistics of ``src``: all that training units reads."""
    for p in [src / "stats.json", *src.glob("*/index.json")]:
        (dst / p.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(p, dst / p.relative_to(src))
    return dst


def test_char_units_are_the_alphabet_bit_for_bit(tiny_features):
    texts = texts_of(tiny_features, ALL_SPLITS) + ["cool  book", "a", "", "it's all ll"]
    for t in texts:
        got, want = CHAR_UNITS.encode(t), alphabet.encode_array(t)
        assert got.dtype == want.dtype and np.array_equal(got, want)
        assert CHAR_UNITS.decode(got) == alphabet.decode(want)
    assert (CHAR_UNITS.num_classes, CHAR_UNITS.name, CHAR_UNITS.sha256) == (30, "char", None)
    assert load_units(None, "char") is CHAR_UNITS and ensure_units(tiny_features, "char", SPLITS) is CHAR_UNITS
    with pytest.raises(alphabet.AlphabetError):
        CHAR_UNITS.encode("caf\u00e9")


@pytest.mark.parametrize("spec", ["bpe500", "BPE:500", "bpe:", "bpe:-3", "bpe:28", "bpe:40000", "chars", "", 500])
def test_a_bad_spec_is_refused_naming_it(spec):
    with pytest.raises(UnitsError, match="loader.units=") as e:
        units_mod.parse_spec(spec)
    assert e.value.exit_code == 2 and repr(spec) in str(e.value)
    problems = LoaderConfig(units=spec).problems()
    assert len(problems) == 1 and problems[0].startswith(f"loader.units={spec!r}")


def test_specs_and_their_classes():
    assert units_mod.parse_spec("char") == ("char", 0) and units_mod.parse_spec("bpe:500") == ("bpe", 500)
    assert units_mod.num_classes_of("char") == 30 and units_mod.num_classes_of("bpe:500") == 501
    assert LoaderConfig().units == "char" and LoaderConfig(units="bpe:1024").problems() == []


def test_bpe_round_trip_on_every_transcript(bpe_feats):
    units = load_units(bpe_feats, SPEC)
    assert (units.name, units.num_classes, units.is_char) == ("bpe100", 101, False)
    texts = texts_of(bpe_feats, ALL_SPLITS)
    for t in texts:
        labels = units.encode(t)
        assert labels.dtype == np.int64 and (labels >= 1).all() and (labels <= 100).all()
        assert units.decode(labels) == t
        assert units.decode(np.concatenate([[0], labels, [0]])) == t  # blanks dropped
    assert sum(len(units.encode(t)) for t in texts) < 0.7 * sum(len(t) for t in texts)  # pieces, not characters
    assert units.decode(units.encode("zebra quiz")) == "zebra quiz"  # no z in the training text: a required character
    with pytest.raises(alphabet.AlphabetError, match="'5'"):
        units.encode("route 5")


def test_the_record_names_what_the_model_was_trained_from(bpe_feats):
    model, record = paths(bpe_feats, SPEC)
    rec = json.loads(record.read_text())
    texts = texts_of(bpe_feats, SPLITS)
    assert rec["sha256"] == hashlib.sha256(model.read_bytes()).hexdigest() == load_units(bpe_feats, SPEC).sha256
    assert rec["splits"] == SPLITS and rec["utterances"] == len(texts)
    assert rec["transcripts_sha256"] == hashlib.sha256("".join(t + "\n" for t in texts).encode()).hexdigest()
    assert rec["sentencepiece"] == spm.__version__ and rec["options"]["model_type"] == "bpe"
    assert rec["options"]["num_threads"] == 1 and rec["options"]["character_coverage"] == 1.0


def test_training_is_byte_deterministic_whatever_the_threads(bpe_feats):
    texts = texts_of(bpe_feats, SPLITS)
    stored = paths(bpe_feats, SPEC)[0].read_bytes()
    assert units_mod.train_bpe(texts, 100) == units_mod.train_bpe(texts, 100) == stored
    four = units_mod.train_bpe(texts, 100, threads=4)  # the same pieces and scores; the model records the count
    a, b = (units_mod._processor(m) for m in (stored, four))
    assert [(a.id_to_piece(i), a.get_score(i)) for i in range(100)] == \
        [(b.id_to_piece(i), b.get_score(i)) for i in range(100)]
    assert units_mod.train_bpe(texts[1:], 100) != stored  # the bytes do follow the text


def test_a_model_that_is_not_its_record_s_is_refused(bpe_feats, tmp_path):
    feats = index_only_copy(bpe_feats, tmp_path)
    shutil.copytree(bpe_feats / "units", feats / "units")
    model, record = paths(feats, SPEC)
    data = bytearray(model.read_bytes())
    data[-5] ^= 1
    model.write_bytes(bytes(data))
    before = {p: p.read_bytes() for p in (feats / "units").iterdir()}
    want, got = json.loads(record.read_text())["sha256"], hashlib.sha256(bytes(data)).hexdigest()
    for load in (lambda: load_units(feats, SPEC), lambda: ensure_units(feats, SPEC, SPLITS)):
        with pytest.raises(UnitsError) as e:
            load()
        assert str(model) in str(e.value) and want in str(e.value) and got in str(e.value) and e.value.exit_code == 2
    assert {p: p.read_bytes() for p in (feats / "units").iterdir()} == before  # nothing written


def test_missing_units_are_named_and_loading_never_trains(bpe_feats, tmp_path):
    feats = index_only_copy(bpe_feats, tmp_path)
    with pytest.raises(UnitsError, match=r"bpe-100\.json is missing.*--units bpe:100"):
        load_units(feats, SPEC)
    assert not (feats / "units").exists()


def test_a_vocabulary_the_corpus_cannot_fill_is_refused_naming_the_largest(bpe_feats, tmp_path):
    feats = index_only_copy(bpe_feats, tmp_path)
    with pytest.raises(UnitsError, match=r"bpe:5000.*cannot fill 5000 BPE pieces; the largest size they fill is "
                                         r"(\d+)") as e:
        ensure_units(feats, "bpe:5000", SPLITS)
    assert e.value.exit_code == 2 and "words" in str(e.value)
    assert not [p for p in (feats / "units").iterdir() if not p.name.startswith(".")]  # no model, no record
    largest = int(str(e.value).rsplit("(bpe:", 1)[1].rstrip(")"))
    assert ensure_units(feats, f"bpe:{largest}", SPLITS).num_classes == largest + 1  # and that one trains


def test_two_trainers_at_once_train_once_and_get_one_file(bpe_feats, tmp_path, monkeypatch):
    """Two callers (threads here: the lock is flock's, per open file, so they exclude each other as
    processes do) find no units; one trains, the other waits and reads its file."""
    feats = index_only_copy(bpe_feats, tmp_path)
    trained, real = [], units_mod.train_bpe
    start = threading.Barrier(2)

    def slow_train(texts, size, threads=1):
        trained.append(size)
        threading.Event().wait(0.3)  # the other caller arrives while this one trains
        return real(texts, size, threads)

    monkeypatch.setattr(units_mod, "train_bpe", slow_train)
    got = [None, None]

    def call(i):
        start.wait()
        got[i] = ensure_units(feats, SPEC, SPLITS)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert trained == [100]
    assert got[0].sha256 == got[1].sha256 == load_units(bpe_feats, SPEC).sha256
    assert paths(feats, SPEC)[0].read_bytes() == paths(bpe_feats, SPEC)[0].read_bytes()


@pytest.mark.parametrize("labels,lens,want", [
    ([], [0, 0], [0, 0]),
    ([5], [1], [1]),
    ([5, 5], [2], [3]),
    ([5, 5, 5, 6, 6], [5], [8]),
    ([5, 5, 5, 5], [2, 2], [3, 3]),
    ([3, 4, 4, 5], [2, 0, 2], [2, 0, 2]),  # 4 | 4 across two utterances is no repeat
    ([1, 2, 29, 2, 1], [5], [5]),  # characters: the separator splits doubled letters
])
def test_ctc_min_frames_by_hand(labels, lens, want):
    got = ctc_min_frames(np.array(labels, dtype=np.int64), np.array(lens))
    assert isinstance(got, np.ndarray) and got.tolist() == want
    t = ctc_min_frames(torch.tensor(labels, dtype=torch.int64), torch.tensor(lens))
    assert isinstance(t, torch.Tensor) and t.dtype == torch.int64 and t.tolist() == want


def test_ctc_min_frames_is_where_torch_s_ctc_loss_turns_infinite():
    labels = torch.tensor([3, 3, 4, 4, 4, 2, 7, 7, 1], dtype=torch.int64)
    lens = torch.tensor([2, 3, 4])
    need = ctc_min_frames(labels, lens)
    for b, targets in enumerate(torch.split(labels, lens.tolist())):
        for frames, finite in ((int(need[b]), True), (int(need[b]) - 1, False)):
            lp = torch.full((frames, 1, 8), -np.log(8.0))  # (T, 1, C)
            loss = F.ctc_loss(lp, targets[None], torch.tensor([frames]), lens[b: b + 1], reduction="none")
            assert bool(torch.isfinite(loss).all()) == finite, (b, frames)


def test_units_cross_to_a_spawned_reader_as_bytes(bpe_feats):
    units = load_units(bpe_feats, SPEC)
    back = pickle.loads(pickle.dumps(units))
    assert back.sha256 == units.sha256 and np.array_equal(back.encode("the cat"), units.encode("the cat"))
    assert pickle.loads(pickle.dumps(CHAR_UNITS)).encode("cool").tolist() == alphabet.encode_array("cool").tolist()


@pytest.mark.parametrize("readers", [0, 1])
def test_the_loader_yields_bpe_labels_when_asked(bpe_feats, readers):
    cfg = LoaderConfig(batch_size=4, readers=readers, prefetch_batches=2, units=SPEC)
    units = load_units(bpe_feats, SPEC)
    batches = list(make_loader(bpe_feats, SPLITS, cfg, epoch=1, seed=0))
    for b in batches:
        labels = torch.split(b.labels, b.label_lens.tolist())
        assert b.labels.dtype == torch.int64
        assert [units.decode(lab.tolist()) for lab in labels] == b.transcripts
        assert [lab.tolist() for lab in labels] == [units.encode(t).tolist() for t in b.transcripts]
    assert max(int(b.labels.max()) for b in batches) > 30  # not characters
    chars = list(make_loader(bpe_feats, SPLITS, LoaderConfig(batch_size=4, readers=0), epoch=1, seed=0))
    assert [b.ids for b in chars] == [b.ids for b in batches]  # the same batches, other labels


def test_the_loader_refuses_units_the_folder_lacks(bpe_feats):
    with pytest.raises(UnitsError, match=r"bpe-200\.json is missing"):
        make_loader(bpe_feats, SPLITS, LoaderConfig(batch_size=4, readers=0, units="bpe:200"), epoch=1, seed=0)


def test_resident_batches_carry_the_bpe_labels_bit_for_bit(bpe_feats):
    """bpe:300's 301 classes do not fit the characters' uint8 buffer: int16."""
    ensure_units(bpe_feats, "bpe:300", SPLITS)
    cfg = LoaderConfig(batch_size=5, readers=0, units="bpe:300")
    ix = load_index(bpe_feats, SPLITS)
    res = Resident(ix, bpe_feats, cfg, torch.device("cpu"), feature_dims(bpe_feats))
    assert res.units.num_classes == 301 and label_dtype(res.units) == np.int16
    assert label_dtype(CHAR_UNITS) == label_dtype(load_units(bpe_feats, SPEC)) == np.uint8
    stream = lambda epoch: make_loader(bpe_feats, SPLITS, cfg, epoch=epoch, seed=5, index=ix)  # noqa: E731
    list(res.loader(stream(1), first=True))
    got, want = list(res.loader(stream(2), first=False)), list(stream(2))
    assert len(got) == len(want) > 0 and max(int(b.labels.max()) for b in want) > 255
    for a, b in zip(got, want):
        assert a.labels.dtype == b.labels.dtype and torch.equal(a.labels, b.labels)
        assert torch.equal(a.label_lens, b.label_lens) and a.transcripts == b.transcripts


def test_prepare_trains_the_units_asked_for_and_refuses_a_bad_spec_first(tiny_corpus, bpe_feats, tmp_path, capsys):
    from speechperf.cli import main

    feats = tmp_path / "feats"
    shutil.copytree(bpe_feats, feats, ignore=shutil.ignore_patterns("units"))  # prepared: no shard is made again
    assert main(["prepare", str(tiny_corpus), str(tmp_path / "new"), "--units", "bpe:x"]) == 2
    assert "--units='bpe:x' must be 'char' or 'bpe:N'" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()  # refused before any work
    assert main(["prepare", str(tiny_corpus), str(feats), "--units", f"char,{SPEC}", "--workers", "1"]) == 0
    assert f"({SPEC}, 101 classes, sha256" in capsys.readouterr().err
    assert paths(feats, SPEC)[0].read_bytes() == paths(bpe_feats, SPEC)[0].read_bytes()  # the stats' splits: SPLITS


def test_a_folder_that_cannot_be_written_is_named(bpe_feats, tmp_path, monkeypatch):
    feats = index_only_copy(bpe_feats, tmp_path)

    def refuse(self, *a, **kw):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(type(feats), "mkdir", refuse)  # root writes anywhere: chmod cannot show it
    with pytest.raises(UnitsError, match=rf"{feats / 'units'} cannot be written \(Permission denied\)"):
        ensure_units(feats, SPEC, SPLITS)
