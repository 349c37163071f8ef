"""The previous release's torchrun worker (ASGD, EASGD and its own loop) on the tiny corpus; a
dead worker and the restart from its checkpoint; bad requests. The sweep: test_sweep.py."""
import json
import re
import threading
import time

import psutil
import pytest

from speechperf.errors import SpeechperfError
from speechperf.parallel import worker


def test_more_workers_than_shards_is_refused(tiny_features, tmp_path):
    with pytest.raises(SpeechperfError, match="shards"):
        worker.launch(["--data", str(tiny_features), "--hidden", "8", "--epochs", "1"], "bsp", 12, [],
                      tmp_path / "many")


def _rank_process(rank: int):
    for p in psutil.Process().children(recursive=True):
        try:
            if p.environ().get("RANK") == str(rank) and "speechperf.parallel" in " ".join(p.cmdline()):
                return p
        except psutil.Error:
            pass
    return None


def _epochs(db, run_id):
    from speechperf.results import ResultsDB

    with ResultsDB(db) as conn:
        return conn.query("SELECT * FROM parallel_epochs WHERE run_id = ? ORDER BY epoch", [run_id])


def test_a_dead_worker_stops_the_run_naming_its_rank_and_the_same_command_resumes(tiny_features, tmp_path):
    out, db = tmp_path / "dead", tmp_path / "results.db"
    common = ["--data", str(tiny_features), "--hidden", "32", "--epochs", "20", "--db", str(db)]
    errors = []

    def run():
        try:
            worker.launch(common, "bsp", 2, ["--sync-period", "1"], out)
        except SpeechperfError as e:
            errors.append(str(e))

    t = threading.Thread(target=run)
    t.start()
    victim, deadline = None, time.time() + 120
    while victim is None and time.time() < deadline:  # rank 1, once the first checkpoint is written
        victim = _rank_process(1) if (out / "checkpoint.pt").exists() else None
        time.sleep(0.05)
    assert victim is not None, "no checkpoint while rank 1 ran"
    victim.kill()
    t.join(timeout=180)
    assert errors and "rank 1" in errors[0], errors
    m = re.search(r"checkpoint\.pt exists \(epoch (\d+)\): the same command resumes from epoch (\d+)", errors[0])
    assert m and int(m.group(2)) == int(m.group(1)) + 1, errors[0]
    done = int(m.group(1))
    assert not (out / "parallel.json").exists()  # the dead run reported nothing

    worker.launch(common, "bsp", 2, ["--sync-period", "1"], out)  # the same command
    summary = json.loads((out / "parallel.json").read_text())
    assert summary["resumed_after"] == [done]
    epochs = _epochs(db, summary["run_id"])
    assert [e["epoch"] for e in epochs] == list(range(1, summary["epochs"] + 1)) and summary["epochs"] > done
    assert all(a["train_s"] < b["train_s"] for a, b in zip(epochs, epochs[1:]))  # training time continues


def test_k_epochs_and_a_resume_equal_the_uninterrupted_run(tiny_features, tmp_path):
    def run(out, epochs):
        worker.launch(["--data", str(tiny_features), "--hidden", "32", "--epochs", str(epochs), "--batch-size", "4",
                       "--db", str(tmp_path / "results.db")], "bsp", 2, ["--sync-period", "2"], out)
        return json.loads((out / "parallel.json").read_text())

    whole = run(tmp_path / "whole", 3)
    run(tmp_path / "parts", 1)
    parts = run(tmp_path / "parts", 3)  # --epochs grew: the finished 1-epoch run continues
    assert parts["resumed_after"] == [1] and whole["resumed_after"] == []
    assert parts["cv_loss"] == pytest.approx(whole["cv_loss"], abs=1e-6)
    assert (parts["syncs"], parts["comm_bytes"], parts["epochs"]) == (whole["syncs"], whole["comm_bytes"], 3)
    assert [e["cv_loss"] for e in _epochs(tmp_path / "results.db", parts["run_id"])] == pytest.approx(
        [e["cv_loss"] for e in _epochs(tmp_path / "results.db", whole["run_id"])], abs=1e-6)


def test_checkpoint_of_another_or_a_finished_run(tmp_path):
    from speechperf.atomic import atomic_torch_save
    from speechperf.parallel.worker import check_checkpoint, finished_run, parse, run_key
    from speechperf.train.checkpoint import FORMAT

    argv = ["--algo", "bmuf", "--data", "FEATS", "--out", str(tmp_path), "--sync-period", "5", "--epochs", "3"]
    path = tmp_path / "checkpoint.pt"
    assert check_checkpoint(path, parse(argv), 2) is None
    with pytest.raises(SpeechperfError, match="no checkpoint"):
        check_checkpoint(path, parse(argv + ["--resume", "yes"]), 2)
    atomic_torch_save({"format": FORMAT, "args": run_key(parse(argv), 2), "epoch": 2, "stopped": False, "run_id": "r1"}, path)
    assert check_checkpoint(path, parse(argv), 2)["epoch"] == 2
    assert check_checkpoint(path, parse(argv + ["--resume", "no"]), 2) is None
    with pytest.raises(SpeechperfError, match=r"--sync-period = 5 there, 20 now"):
        check_checkpoint(path, parse(argv + ["--sync-period", "20"]), 2)
    with pytest.raises(SpeechperfError, match=r"--optimizer = 'sgd' there, 'adamw' now"):
        check_checkpoint(path, parse(argv + ["--optimizer", "adamw"]), 2)
    with pytest.raises(SpeechperfError, match=r"workers \(--nproc-per-node\) = 2 there, 4 now"):
        check_checkpoint(path, parse(argv), 4)
    assert check_checkpoint(path, parse(argv + ["--epochs", "2"]), 2) is None  # finished: starts over
    with pytest.raises(SpeechperfError, match="finished run .--epochs 2 reached after epoch 2"):
        check_checkpoint(path, parse(argv + ["--epochs", "2", "--resume", "yes"]), 2)
    # a sweep run again keeps a finished, reported run of the same arguments and trains the others
    assert not finished_run(tmp_path, argv + ["--epochs", "2"], 2)  # not reported yet
    (tmp_path / "parallel.json").write_text(json.dumps({"run_id": "r1"}))
    assert finished_run(tmp_path, argv + ["--epochs", "2"], 2)
    assert not finished_run(tmp_path, argv, 2)  # --epochs 3: one epoch left to resume
    assert not finished_run(tmp_path, argv + ["--epochs", "2", "--sync-period", "20"], 2)
    assert not finished_run(tmp_path, argv + ["--epochs", "2", "--resume", "no"], 2)


def test_a_missing_split_is_refused_before_any_worker_trains(tiny_features, tmp_path):
    import shutil

    from speechperf.parallel.worker import _train_splits

    feats = tmp_path / "feats"
    shutil.copytree(tiny_features, feats)
    (feats / "dev-clean" / "index.json").unlink()  # the CV loss of every epoch reads it
    with pytest.raises(SpeechperfError, match="validation split 'dev-clean'"):
        _train_splits(feats, 2, 8)
