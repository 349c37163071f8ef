"""FEATS/stats.json never changes under a repair: it records the training splits it was
computed over, the repair command the loader and the split check print keeps it byte for
byte, and a training split outside the recorded ones needs ``--recompute-stats``."""
import json
import shlex
import shutil
import subprocess
import sys

import pytest

from speechperf.data.check import SplitError, verify_splits
from speechperf.features.prepare import prepare
from speechperf.features.stats import StatsError, stats_sha256, write_stats


@pytest.fixture
def feats(tiny_features, tmp_path):
    out = tmp_path / "feats"
    shutil.copytree(tiny_features, out)
    return out


def test_the_printed_repair_command_repairs_without_changing_the_statistics(feats, tiny_corpus):
    stats = (feats / "stats.json").read_bytes()
    shard = feats / "train-clean" / "shard-00000.npz"
    original = shard.read_bytes()
    shard.write_bytes(b"")  # emptied: the split check names it and prints the repair
    with pytest.raises(SplitError) as e:
        verify_splits(feats)
    command = str(e.value).split("rebuild it with: ")[1]
    assert command == f"speechperf prepare {tiny_corpus} {feats} --splits train-clean"
    argv = shlex.split(command)
    p = subprocess.run([sys.executable, "-m", *argv, "--workers", "1", "--json"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert shard.read_bytes() == original  # repaired ...
    assert (feats / "stats.json").read_bytes() == stats  # ... and the normalization is the one runs trained on


def test_a_training_split_outside_the_recorded_statistics_is_refused_by_name(feats, tiny_corpus):
    write_stats(feats, ["train-clean"], recompute=True)  # a folder whose statistics cover train-clean only
    narrow = (feats / "stats.json").read_bytes()
    with pytest.raises(StatsError, match=r"stats.json was computed over train-clean; train-other is a training "
                                         r"split outside them.*--recompute-stats") as e:
        prepare(tiny_corpus, feats, splits=["train-other"], workers=1, progress=False)
    assert str(feats / "stats.json") in str(e.value)
    assert (feats / "stats.json").read_bytes() == narrow  # refused before any work
    p = subprocess.run([sys.executable, "-m", "speechperf", "prepare", str(tiny_corpus), str(feats), "--splits",
                        "train-other", "--workers", "1", "--json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and str(feats / "stats.json") in p.stderr, p.stderr


def test_recompute_stats_covers_every_prepared_training_split_and_says_so(feats, tiny_corpus, tiny_features,
                                                                          capsys):
    write_stats(feats, ["train-clean"], recompute=True)
    assert json.loads((feats / "stats.json").read_text())["splits"] == ["train-clean"]  # what it was computed over
    narrow = stats_sha256(feats)
    prepare(tiny_corpus, feats, splits=["train-other"], workers=1, progress=False, recompute_stats=True)
    assert json.loads((feats / "stats.json").read_text())["splits"] == ["train-clean", "train-other"]
    assert (feats / "stats.json").read_bytes() == (tiny_features / "stats.json").read_bytes()
    err = capsys.readouterr().err
    assert f"{feats / 'stats.json'} recomputed over train-clean, train-other (sha256 {narrow[:12]}" in err


def test_an_unreadable_stats_file_is_refused_by_name(feats, tiny_corpus):
    (feats / "stats.json").write_text("{trunc")
    with pytest.raises(StatsError, match=r"stats.json cannot be read .*--recompute-stats"):
        prepare(tiny_corpus, feats, splits=["train-clean"], workers=1, progress=False)
