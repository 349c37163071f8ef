"""A split's index.json of another shape (valid JSON, not speechperf's) is one line naming the
file and the repair, exit 2, wherever it is read (``bench feed --data``, training, evaluation):
never a KeyError from the loader."""
import json
import re

import pytest

from speechperf.cli import main
from speechperf.data.index import load
from speechperf.errors import SpeechperfError
from speechperf.features.shards import load_index

GOOD = {"id": "1-2-0000", "shard": "shard-00000", "offset": 0, "frames": 100, "duration": 1.0,
        "transcript": "a", "speaker": "1"}


def _split(tmp_path, index) -> tuple:
    feats = tmp_path / "feats"
    (feats / "train-clean").mkdir(parents=True)
    (feats / "train-clean" / "index.json").write_text(json.dumps(index))
    (feats / "features.json").write_text("{}")
    return feats, feats / "train-clean" / "index.json"


@pytest.mark.parametrize("index, says", [
    ({"utterances": [GOOD]}, "lacks 'shards' (dict)"),
    ({"split": "x"}, "lacks 'utterances' (list) and 'shards' (dict)"),
    ([1, 2], "lacks 'utterances' (list) and 'shards' (dict)"),
    ({"utterances": {"a": 1}, "shards": {}}, "lacks 'utterances' (list)"),
])
def test_an_index_of_another_shape_is_refused_naming_it(tmp_path, index, says):
    feats, path = _split(tmp_path, index)
    wanted = f"{re.escape(str(path))} is not a split index of speechperf's .*{re.escape(says)}"
    with pytest.raises(SpeechperfError, match=wanted) as e:
        load_index(path.parent)
    assert "rebuild it with: speechperf prepare" in str(e.value) and e.value.exit_code == 2


@pytest.mark.parametrize("record, says", [
    ({k: v for k, v in GOOD.items() if k != "frames"}, "lacks a field or holds another type (KeyError: 'frames')"),
    ({k: v for k, v in GOOD.items() if k != "shard"}, "an utterance record lacks its 'shard'"),
    ({**GOOD, "offset": "x"}, "lacks a field or holds another type (ValueError"),
    ("1-2-0000", "an utterance record is not an object"),
])
def test_a_record_of_another_shape_is_refused_naming_the_index(tmp_path, record, says):
    feats, path = _split(tmp_path, {"utterances": [record], "shards": {"shard-00000": "0" * 64}})
    with pytest.raises(SpeechperfError, match=f"{re.escape(str(path))}: .*{re.escape(says)}"):
        load(feats, ["train-clean"])


def test_bench_feed_on_such_a_folder_is_one_line_exit_2(tmp_path, capsys):
    feats, path = _split(tmp_path, {"utterances": [GOOD]})
    assert main(["bench", "feed", "--data", str(feats), "--preset", "gpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path} is not a split index of speechperf's" in err, err
