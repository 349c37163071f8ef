"""``speechperf parallel sweep``: runs of ``speechperf train``, one per algorithm and worker
count, and its table against the one worker; run again, it only reports."""
import json
import time

import pytest

from speechperf.cli import main
from speechperf.errors import SpeechperfError
from speechperf.parallel import sweep

SETS = ["--set", "max_epochs=1", "--set", "threads=1", "--set", "device=cpu", "--set", "final_splits=none"]


@pytest.mark.timeout(600)
def test_a_sweep_trains_each_algorithm_through_train_and_tabulates_it(tiny_features, tmp_path, capsys):
    argv = ["--data", str(tiny_features), "--out", str(tmp_path / "sw"), "--algos", "sync,diloco", "--workers", "2",
            "--sync-every", "3", *SETS]
    rows = sweep.run_sweep(argv)
    by = {(r["algorithm"], r["workers"]): r for r in rows}
    assert [r["run"] for r in rows] == ["one-worker", "sync-n2", "diloco-n2-h3"]
    one, ddp, diloco = by[("sync", 1)], by[("sync", 2)], by[("diloco", 2)]
    assert one["speedup"] == 1 and one["comm %"] == 0 and one["sync every"] is None
    for r in (ddp, diloco):
        assert r["speedup"] > 0 and 0 < r["comm %"] < 100 and r["MFU %"] > 0 and r["status"] == "success"
        assert r["WER"] is not None and r["CER"] is not None and r["epochs"] == 1
    assert diloco["sync every"] == 3
    config = json.loads((tmp_path / "sw" / "diloco-n2-h3" / "config.json").read_text())
    assert (config["algo"]["name"], config["algo"]["sync_every"], config["train"]["max_epochs"]) == ("diloco", 3, 1)
    t = time.perf_counter()
    assert sweep.run_sweep(argv) == rows  # again: every run finished, none is trained (or recorded) twice
    assert time.perf_counter() - t < 60
    assert main(["parallel", "sweep", *argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(rows))


def test_the_grid_names_every_run_and_a_failed_run_says_how_to_continue(tiny_features, tmp_path):
    a = sweep.parse(["--data", "F", "--out", "O", "--algos", "sync,bsp,bmuf", "--workers", "2,4",
                     "--sync-every", "1,20"])
    names = [name for name, _, _ in sweep.grid(a)]
    assert names == ["one-worker", "sync-n2", "sync-n4", "bsp-n2-h1", "bsp-n2-h20", "bsp-n4-h1", "bsp-n4-h20",
                     "bmuf-n2-h1", "bmuf-n2-h20", "bmuf-n4-h1", "bmuf-n4-h20"]
    with pytest.raises(SpeechperfError, match=r"one-worker x1: train failed \(exit 2\)(.|\n)*train.lr=-1.0 must be > 0"
                                              "(.|\n)*the same sweep command continues it"):
        sweep.run_sweep(["--data", str(tiny_features), "--out", str(tmp_path / "bad"), "--set", "lr=-1"])
