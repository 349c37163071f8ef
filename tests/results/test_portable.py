"""Done-when of the portable run folder: two runs made as on two machines (labels, platform
profiles), moved and renamed, read from another directory: ``tta`` and ``report`` give the
same numbers as over the originals, nothing is written outside the named folders, and a
missing features folder is a clear error for ``eval``."""
import csv
import json
import os
import shutil
from functools import partial

from speechperf.train.loop import TrainRequest, train
from tests.conftest import cli as run_cli

cli = partial(run_cli, check=True)  # a command that fails fails the test, unless check=False


def _files(root) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs}


def _csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_moved_and_renamed_runs_compare_the_same_from_anywhere(tiny_features, tmp_path):
    feats = tmp_path / "feats"
    shutil.copytree(tiny_features, feats)
    for machine, platform in (("machineA", "sys1"), ("machineB", "sys2")):
        # batch 8: sys1/sys2 set the paper's 96, more than the tiny corpus holds (refused)
        train(TrainRequest(preset="tiny", data=feats, out=tmp_path / machine / "run",
                           overrides=["max_epochs=1", "threads=1", "readers=0", "loader.batch_size=8"],
                           quiet=True, platform=platform, label=f"{machine} tiny"))
    a, b = tmp_path / "machineA" / "run", tmp_path / "machineB" / "run"
    tta_args = ["--targets", "100,0.001", "--epochs", "1", "--json"]  # 100: reached unless insertions pass 100%
    before = json.loads(cli("tta", a, b, *tta_args, cwd=tmp_path).stdout)["runs"]
    cli("report", a, b, "--out", tmp_path / "rep1", cwd=tmp_path)

    moved = tmp_path / "copied"
    moved.mkdir()
    shutil.move(a, moved / "cpu2")
    shutil.move(b, moved / "h100")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    files = _files(tmp_path)
    after = json.loads(cli("tta", "../copied/cpu2", "../copied/h100", *tta_args, cwd=elsewhere).stdout)["runs"]
    assert after == before
    assert [(r["run"], r["target"]) for r in after] == [("machineA tiny", 100.0), ("machineA tiny", 0.001),
                                                        ("machineB tiny", 100.0), ("machineB tiny", 0.001)]
    assert [r["minutes"] is None for r in after if r["target"] == 0.001] == [True, True]
    cli("report", "../copied/cpu2", "../copied/h100", "--out", "rep2", cwd=elsewhere)
    for name in ("tta.csv", "throughput.csv", "final.csv", "price.csv"):
        assert _csv(elsewhere / "rep2" / name) == _csv(tmp_path / "rep1" / name), name
    runs = _csv(elsewhere / "rep2" / "runs.csv")
    assert [(r["run"], r["platform"]) for r in runs] == [("machineA tiny", "Sys1$"), ("machineB tiny", "Sys2$")]
    new = _files(tmp_path) - files
    assert all(f.startswith(("elsewhere/rep2/", "copied/cpu2/", "copied/h100/")) for f in new), new
    assert not any(f.startswith("copied/") and not f.split("/")[-1].startswith("results.db-") for f in new), new

    # the features moved away: eval says so (exit 2), and --data points to them
    shutil.move(feats, tmp_path / "feats-elsewhere")
    bad = cli("eval", "../copied/cpu2", "--decoder", "greedy", cwd=elsewhere, check=False)
    assert bad.returncode == 2 and "machineA tiny" in bad.stderr and "its features folder is not here" in bad.stderr \
        and "give --data FEATS" in bad.stderr, bad.stderr
    row = json.loads(cli("eval", "../copied/cpu2", "--decoder", "greedy", "--data", tmp_path / "feats-elsewhere",
                         "--json", cwd=elsewhere).stdout)
    assert row[0]["n_utts"] > 0
