"""The features checksum (features/checksum.py): a folder without units keeps the value it had
before units existed, bit for bit; BPE units' records join it where present."""
import hashlib
import shutil

import pytest

from speechperf.data.units import ensure_units, paths
from speechperf.features.checksum import OVER, features_sha256

SPLITS = ["train-clean", "train-other"]


def checksum_before_units(feats):
    """The checksum as it was defined before output units: stats.json and every SPLIT/index.json."""
    files = sorted(p for p in [feats / "stats.json", *feats.glob("*/index.json")] if p.is_file())
    digest = hashlib.sha256()
    for p in files:
        digest.update(f"{p.relative_to(feats).as_posix()}\0{hashlib.sha256(p.read_bytes()).hexdigest()}\n".encode())
    return digest.hexdigest()


@pytest.fixture
def feats(tiny_features, tmp_path):
    """The tiny folder's index files and statistics (what the checksum reads), copied: the shared one is only read."""
    for p in [tiny_features / "stats.json", *tiny_features.glob("*/index.json")]:
        (tmp_path / p.relative_to(tiny_features)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(p, tmp_path / p.relative_to(tiny_features))
    return tmp_path


def test_a_folder_without_units_keeps_its_checksum(tiny_features, feats):
    assert features_sha256(tiny_features) == checksum_before_units(tiny_features)
    assert features_sha256(feats) == features_sha256(tiny_features)  # the shards' bytes are in the indexes
    assert features_sha256(feats, "char") == features_sha256(feats, "bpe:100") == features_sha256(feats)
    assert "units/*.json" in OVER and "stats.json" in OVER


def test_units_change_the_checksum_where_present(feats):
    before = features_sha256(feats)
    ensure_units(feats, "bpe:100", SPLITS)
    with_100 = features_sha256(feats)
    assert with_100 != before
    assert features_sha256(feats, "char") == before  # a character run's folder checksum stays its own
    assert features_sha256(feats, "bpe:100") == with_100
    ensure_units(feats, "bpe:60", SPLITS)
    assert features_sha256(feats) not in (before, with_100)
    assert features_sha256(feats, "bpe:100") == with_100 and features_sha256(feats, "bpe:60") != with_100
    model, record = paths(feats, "bpe:100")
    record.write_text(record.read_text().replace('"utterances"', '"utterances" '))  # another record
    assert features_sha256(feats, "bpe:100") != with_100
    model.unlink()  # the model itself is covered through its sha256 in the record
    assert features_sha256(feats, "char") == before
