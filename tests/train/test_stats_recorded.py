"""A run records the feature statistics it trained on (the sha256 of FEATS/stats.json, in
run.json's data section) and neither continues nor evaluates on other ones: a run resumed
on changed statistics mixed two normalizations, its losses differing from the first step."""
import hashlib
import json
import shutil

import pytest

from speechperf.features.stats import write_stats
from tests.conftest import cli

ARGS = ["--preset", "tiny", "threads=1", "max_epochs=1", "checkpoint_every=3", "sentence_every=50"]


@pytest.mark.timeout(600)
def test_a_run_refuses_to_continue_or_evaluate_on_other_statistics(tiny_features, tmp_path):
    feats, run = tmp_path / "feats", tmp_path / "run"
    shutil.copytree(tiny_features, feats)
    p = cli("train", "--data", feats, "--out", run, *ARGS, "--json")
    assert p.returncode == 0, p.stderr
    trained_on = hashlib.sha256((feats / "stats.json").read_bytes()).hexdigest()
    assert json.loads((run / "run.json").read_text())["data"]["stats_sha256"] == trained_on
    (run / "summary.json").unlink()  # unfinished: the same command continues it from its checkpoint

    write_stats(feats, ["train-clean"], recompute=True)  # another normalization under the run
    now = hashlib.sha256((feats / "stats.json").read_bytes()).hexdigest()
    assert now != trained_on
    for args in (["train", "--data", feats, "--out", run, *ARGS], ["eval", run, "--decoder", "greedy"]):
        p = cli(*args)
        assert p.returncode == 2, p.stderr
        assert str(feats / "stats.json") in p.stderr and trained_on in p.stderr and now in p.stderr, p.stderr
        assert "Traceback" not in p.stderr

    shutil.copy(tiny_features / "stats.json", feats / "stats.json")  # the statistics it trained on: continues
    p = cli("train", "--data", feats, "--out", run, *ARGS, "--json")
    assert p.returncode == 0, p.stderr
