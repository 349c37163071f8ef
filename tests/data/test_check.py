"""verify_splits: every split a run uses is intact, or an error naming it, before training."""
import json
import shutil

import pytest

from speechperf.data.check import FINAL_SPLITS, SplitError, parse_splits, verify_splits
from speechperf.features.shards import load_index


@pytest.fixture
def feats(tiny_features, tmp_path):
    out = tmp_path / "feats"
    shutil.copytree(tiny_features, out)
    return out


def _train(feats):
    return sorted(p.name for p in feats.iterdir() if p.name.startswith("train"))


def test_intact_folder_lists_what_is_used(feats):
    used = verify_splits(feats, batch_size=4)
    assert used["train"] == _train(feats) and used["valid"] == "dev-clean"
    assert used["final"] == [s for s in FINAL_SPLITS if (feats / s).is_dir()]
    for split in {*used["train"], "dev-clean", *used["final"]}:
        index = load_index(feats / split)
        assert used["splits"][split]["utterances"] == len(index["utterances"])
        assert used["splits"][split]["shards"] == len(index["shards"])


@pytest.mark.parametrize("split,role", [("train-clean", "train"), ("dev-clean", "validation"),
                                        ("test-other", "final-evaluation")])
def test_a_deleted_index_is_an_error_naming_the_split_and_the_repair(feats, tiny_corpus, split, role):
    (feats / split / "index.json").unlink()
    with pytest.raises(SplitError) as e:
        verify_splits(feats)
    msg = str(e.value)
    assert f"{role} split {split!r}" in msg and str(feats / split / "index.json") in msg
    assert f"speechperf prepare {tiny_corpus} {feats} --splits {split}" in msg


def test_a_vanished_train_folder_is_missing_not_absent(feats):
    train = _train(feats)
    shutil.rmtree(feats / train[-1])  # stats.json was computed over it: it was prepared
    with pytest.raises(SplitError, match=f"train split {train[-1]!r}"):
        verify_splits(feats)


def test_named_splits_are_used_exactly(feats):
    train = _train(feats)
    shutil.rmtree(feats / "test-other")
    (feats / train[-1] / "index.json").unlink()
    used = verify_splits(feats, train=train[:1], final=["test-clean"])
    assert used["train"] == train[:1] and used["final"] == ["test-clean"]
    assert verify_splits(feats, train=train[:1], final=parse_splits("none"))["final"] == []
    with pytest.raises(SplitError, match="final-evaluation split 'test-other'"):
        verify_splits(feats, train=train[:1], final=["test-other"])
    with pytest.raises(SplitError, match="names no split to train on"):
        verify_splits(feats, train=parse_splits("none"))


def test_damaged_index_shard_and_empty_split(feats):
    good = (feats / "dev-clean" / "index.json").read_text()
    (feats / "dev-clean" / "index.json").write_text("{not json")
    with pytest.raises(SplitError, match="validation split 'dev-clean'.*not valid JSON"):
        verify_splits(feats)
    (feats / "dev-clean" / "index.json").write_text(good)
    (feats / "test-clean" / "shard-00000.npz").unlink()
    with pytest.raises(SplitError, match=r"final-evaluation split 'test-clean': shard .*shard-00000\.npz is missing"):
        verify_splits(feats)
    index = load_index(feats / "test-other")
    (feats / "test-other" / "index.json").write_text(json.dumps({**index, "utterances": []}))
    with pytest.raises(SplitError, match="test-other.*lists no utterances"):
        verify_splits(feats, final=["test-other"])


def test_batch_larger_than_the_data_names_both_numbers(feats):
    n = sum(len(load_index(feats / s)["utterances"]) for s in _train(feats))
    assert verify_splits(feats, batch_size=n)["train"]
    with pytest.raises(SplitError, match=f"loader.batch_size={n + 1} is larger than the {n} utterances"):
        verify_splits(feats, batch_size=n + 1)
    with pytest.raises(SplitError, match="loader.batch_size=1 is the batch over all 2 processes"):
        verify_splits(feats, batch_size=1, world=2)


def test_not_a_features_folder(tmp_path):
    with pytest.raises(SplitError, match="no features.json"):
        verify_splits(tmp_path)


def test_parse_splits():
    assert parse_splits("") is None and parse_splits("none") == []
    assert parse_splits(" train-clean-100, train-clean-360 ") == ["train-clean-100", "train-clean-360"]


def test_shards_are_hashed_once_per_process_until_a_file_changes(feats, monkeypatch):
    """A new run verifies its splits twice (before its folder, then in training); the shards'
    bytes are read once, and a shard rewritten since is hashed again and refused."""
    import speechperf.data.check as check

    reads = []
    monkeypatch.setattr(check, "file_sha256", lambda path: reads.append(path) or check_sha(path))
    check._hashed.cache_clear()
    verify_splits(feats)
    first = len(reads)
    verify_splits(feats)
    assert first > 0 and len(reads) == first
    shard = sorted((feats / "dev-clean").glob("*.npz"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(SplitError, match="does not match its checksum"):
        verify_splits(feats)
    assert reads[first:] == [shard]


def check_sha(path):
    from speechperf.features.shards import file_sha256

    return file_sha256(path)
