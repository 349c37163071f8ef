"""lhotse manifests as a corpus (corpus/manifests.py): the samples of a cut equal lhotse's own
loading, and each bad manifest is refused naming its file and cut. The manifests are written
with lhotse's own API."""
import re
import sys

import numpy as np
import pytest
import soundfile as sf
from lhotse import CutSet, MonoCut, MultiCut, Recording, RecordingSet, SupervisionSegment, SupervisionSet

from speechperf.corpus.librispeech import read_audio
from speechperf.corpus.manifests import ManifestError, split_manifests
from tests.conftest import tone


def _long_recording(tmp_path, channels=1):
    """A 3.0 s file (stereo: a different tone per channel) and its Recording."""
    audio = np.stack([tone(3.0, f=300.0 + 200 * c) for c in range(channels)], axis=1)
    sf.write(tmp_path / "talk.flac", audio if channels > 1 else audio[:, 0], 16000)
    return Recording.from_file(tmp_path / "talk.flac", recording_id="talk")


def _cut(rec, cid, start, duration, text="SOME WORDS", channel=0, **sup):
    return MonoCut(cid, start=start, duration=duration, channel=channel, recording=rec,
                   supervisions=[SupervisionSegment(f"{cid}-s", rec.id, start=0, duration=duration, text=text,
                                                    channel=channel, **sup)])


def _utterances(path, split="train"):
    (m,) = split_manifests([(split, path)])
    problems = []
    return list(m.utterances(problems)), problems


def _read(u):
    return read_audio(u.audio_path, 16000, u.start, u.samples, u.channel)


@pytest.mark.parametrize("channels", [1, 2])
def test_a_cut_reads_the_samples_lhotse_loads(tmp_path, channels):
    rec = _long_recording(tmp_path, channels)
    # odd offsets (sample arithmetic rounds), the channel of a stereo file, and a cut 10 ms past
    # the file's end that lhotse completes by reflection (within its 25 ms tolerance)
    cuts = CutSet.from_cuts([_cut(rec, "a", 0.12345, 1.00007, channel=channels - 1),
                             _cut(rec, "b", 1.5, 1.51), _cut(rec, "c", 0.0, 3.0)])
    cuts.to_file(tmp_path / "cuts.jsonl.gz")
    utts, problems = _utterances(tmp_path / "cuts.jsonl.gz")
    assert not problems and [u.id for u in utts] == ["a", "b", "c"]
    for u, cut in zip(utts, cuts):
        mine, theirs = _read(u), cut.load_audio()[0]
        assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs), cut.id
    assert utts[2].samples == -1  # the whole file, read as the LibriSpeech layout reads it
    if channels == 1:
        assert np.array_equal(_read(utts[2]), read_audio(tmp_path / "talk.flac"))


def test_recordings_with_supervisions_are_one_utterance_per_supervision(tmp_path):
    rec = _long_recording(tmp_path)
    sups = [SupervisionSegment("s1", "talk", start=0.25, duration=1.0, text="Hello  World ", speaker="ann"),
            SupervisionSegment("s2", "talk", start=1.75, duration=0.5, text="ROOM 101", speaker="bob"),
            SupervisionSegment("s3", "talk", start=2.5, duration=0.4, text="  ", speaker="bob")]
    RecordingSet.from_recordings([rec]).to_file(tmp_path / "recs.jsonl")
    SupervisionSet.from_segments(sups).to_file(tmp_path / "sups.jsonl.gz")
    (m,) = split_manifests([("dev-clean", tmp_path / "sups.jsonl.gz"), ("dev-clean", tmp_path / "recs.jsonl")])
    problems = []
    (u,) = list(m.utterances(problems))
    assert (u.id, u.transcript, u.speaker, u.split) == ("s1", "hello world", "ann", "dev-clean")
    cut = CutSet.from_manifests(RecordingSet.from_recordings([rec]), SupervisionSet.from_segments(sups))
    (lhotse_s1,) = [c for c in cut.trim_to_supervisions() if c.supervisions[0].id == "s1"]
    assert np.array_equal(_read(u), lhotse_s1.load_audio()[0])
    # the same drop report as the LibriSpeech layout's, naming the manifest and the cut
    assert [(p.kind, p.path.name) for p in problems] == [("alphabet", "talk.flac"), ("empty_transcript", "talk.flac")]
    assert problems[0].message.startswith(f"{tmp_path / 'sups.jsonl.gz'}: cut s2: ")
    assert m.estimate() == 1  # the utterances kept by their text


def _write(tmp_path, cuts, name="cuts.jsonl.gz"):
    CutSet.from_cuts(cuts).to_file(tmp_path / name)
    return tmp_path / name


def _refusal(tmp_path, case):
    """(manifest, words the refusal says) for each kind of bad manifest."""
    rec = _long_recording(tmp_path)
    if case == "missing file":
        return tmp_path / "nope.jsonl.gz", "does not exist"
    if case == "unknown format":
        (tmp_path / "cuts.json").write_text("[]")
        return tmp_path / "cuts.json", "unknown format"
    if case == "not lhotse":
        (tmp_path / "x.jsonl").write_text('{"path": "a.wav", "text": "hi"}\n')
        return tmp_path / "x.jsonl", "x.jsonl:1: not a lhotse manifest line"
    if case == "no text":
        return _write(tmp_path, [_cut(rec, "a", 0, 1), _cut(rec, "b", 1, 1, text=None)]), "cut b: supervision b-s has no text"
    if case == "missing audio":
        path = _write(tmp_path, [_cut(rec, "a", 0, 1)])
        (tmp_path / "talk.flac").unlink()
        return path, "cut a: audio source"
    if case == "two supervisions":
        c = _cut(rec, "a", 0, 2)
        c.supervisions.append(SupervisionSegment("a-t", "talk", start=1, duration=1, text="MORE"))
        return _write(tmp_path, [c]), "cut a: 2 supervisions"
    if case == "no supervision":
        c = _cut(rec, "a", 0, 1)
        c.supervisions.clear()
        return _write(tmp_path, [c]), "cut a: 0 supervisions"
    if case == "multi-channel":
        stereo = _long_recording(tmp_path, channels=2)
        sup = SupervisionSegment("m-s", "talk", 0, 1, text="HI", channel=[0, 1])
        return (_write(tmp_path, [MultiCut("m", 0, 1, [0, 1], recording=stereo, supervisions=[sup])]),
                "cut m: a multi-channel cut (channels [0, 1])")
    if case == "mixed":
        return _write(tmp_path, [_cut(rec, "a", 0, 1).pad(duration=2.0)]), "a MixedCut"
    if case == "transforms":
        return _write(tmp_path, [_cut(rec, "a", 0, 1).resample(8000)]), "cut a: recording talk has transforms (Resample)"
    if case == "url":
        rec.sources[0].type, rec.sources[0].source = "url", "https://example.org/talk.flac"
        return _write(tmp_path, [_cut(rec, "a", 0, 1)]), "cut a: recording talk's audio is a 'url' source"
    if case == "duplicate id":
        return _write(tmp_path, [_cut(rec, "a", 0, 1), _cut(rec, "a", 1, 1)]), "cut a: the id appears twice"
    raise AssertionError(case)


CASES = ["missing file", "unknown format", "not lhotse", "no text", "missing audio", "two supervisions",
         "no supervision", "multi-channel", "mixed", "transforms", "url", "duplicate id"]


@pytest.mark.parametrize("case", CASES)
def test_a_bad_manifest_is_refused_naming_file_and_cut(tmp_path, case):
    path, words = _refusal(tmp_path, case)
    with pytest.raises(ManifestError) as e:
        _utterances(path)
    assert str(path.name) in str(e.value) and words in str(e.value)


def test_a_split_is_one_cutset_or_recordings_with_supervisions(tmp_path):
    rec = _long_recording(tmp_path)
    RecordingSet.from_recordings([rec]).to_file(tmp_path / "recs.jsonl.gz")
    cuts = _write(tmp_path, [_cut(rec, "a", 0, 1)])
    with pytest.raises(ManifestError, match="split 'train' has recordings .* give one CutSet, or one RecordingSet"):
        split_manifests([("train", tmp_path / "recs.jsonl.gz")])
    with pytest.raises(ManifestError, match="names two cuts manifests"):
        split_manifests([("train", cuts), ("train", cuts)])
    with pytest.raises(ManifestError, match="split name '../x' is not a folder name"):
        split_manifests([("../x", cuts)])


def test_a_gz_manifest_cut_short_is_refused_naming_it(tmp_path):
    rec = _long_recording(tmp_path)
    cuts = _write(tmp_path, [_cut(rec, f"c{i}", 0.1 * i, 0.5) for i in range(20)])
    whole = cuts.read_bytes()
    cuts.write_bytes(whole[:len(whole) - 30])  # the gzip stream's end and its trailer gone: EOFError
    with pytest.raises(ManifestError, match=f"manifest {re.escape(str(cuts))} cannot be read \\(EOFError"):
        split_manifests([("train", cuts)])


def test_without_lhotse_the_refusal_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "lhotse.serialization", None)  # import fails as if not installed
    with pytest.raises(ManifestError, match=r"needs lhotse .*pip install 'speechperf\[lhotse\]'"):
        split_manifests([("train", tmp_path / "cuts.jsonl.gz")])


def test_a_segment_past_the_files_end_or_a_missing_channel_is_an_audio_problem(tmp_path):
    from speechperf.corpus.librispeech import AudioError

    rec = _long_recording(tmp_path)
    _write(tmp_path, [_cut(rec, "a", 2.5, 0.6)])
    rec.sources[0].channels = [0, 1]  # a manifest that says the mono file has two channels
    _write(tmp_path, [_cut(rec, "b", 0, 1, channel=1)], name="two.jsonl.gz")
    (late,), _ = _utterances(tmp_path / "cuts.jsonl.gz")
    with pytest.raises(AudioError) as e:  # 100 ms short: past lhotse's 25 ms tolerance too
        _read(late)
    assert e.value.kind == "segment_past_end" and "talk.flac" in str(e.value)
    (wrong,), _ = _utterances(tmp_path / "two.jsonl.gz")
    with pytest.raises(AudioError, match="no channel 1 .the file has 1."):
        _read(wrong)
