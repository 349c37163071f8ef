
import pytest

from speechperf.corpus.librispeech import AudioError, check_corpus, find_splits, read_audio, scan_split
from speechperf.errors import SpeechperfError


def test_scan_reports_text_side_problems_naming_files(bad_corpus):
    assert find_splits(bad_corpus) == ["train-clean"]
    scan = scan_split(bad_corpus, "train-clean")
    kinds = {p.kind: p for p in scan.problems}
    assert set(kinds) == {"missing_audio", "missing_transcript", "alphabet", "empty_transcript", "malformed_line"}
    assert "19-198-0006" in kinds["missing_audio"].message and "19-198.trans.txt" in kinds["missing_audio"].message
    assert kinds["missing_transcript"].path.name == "19-198-0007.flac"
    assert kinds["alphabet"].path.name == "19-198-0008.flac" and "'01'" in kinds["alphabet"].message
    assert kinds["empty_transcript"].path.name == "19-198-0009.flac"
    ids = [u.id for u in scan.utterances]
    assert ids[:3] == ["19-198-0000", "19-198-0001", "19-198-0002"]
    assert scan.utterances[1].transcript == "a cool dog's bone"
    assert scan.utterances[0].speaker == "19" and scan.utterances[0].chapter == "198"


@pytest.mark.parametrize("name,kind", [("19-198-0003.flac", "sample_rate"), ("19-198-0004.flac", "unreadable_audio"),
                                       ("19-198-0005.flac", "unreadable_audio")])
def test_read_audio_rejects_bad_audio_naming_the_file(bad_corpus, name, kind):
    path = bad_corpus / "train-clean" / "19" / "198" / name
    with pytest.raises(AudioError) as e:
        read_audio(path)
    assert e.value.kind == kind and name in str(e.value)


def test_check_corpus_rows(bad_corpus):
    (row,) = check_corpus(bad_corpus)
    assert row["split"] == "train-clean" and row["problems"] == 5
    assert row["missing_audio"] == 1


def test_missing_split_and_folder(tmp_path):
    with pytest.raises(SpeechperfError, match="does not exist"):
        find_splits(tmp_path / "nope")
    with pytest.raises(SpeechperfError, match="not found"):
        scan_split(tmp_path, "dev-clean")
