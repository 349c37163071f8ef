"""The run folder: create and open, labels, portability of recorded paths, its format, clear
errors instead of empty results, and concurrent writers."""
import json
import multiprocessing
import shutil

import pytest

from speechperf.errors import SpeechperfError
from speechperf.results import ResultsDB
from speechperf.results.labels import default_label, unique_labels
from speechperf.results.formats import FORMAT
from speechperf.results.progress import Progress
from speechperf.results.run import Run
from speechperf.results.view import RunView
from speechperf.hardware.machine import machine_name, short_cpu, short_gpu

CPU_ENV = {"cpu_model": "Intel(R) Xeon(R) CPU @ 2.20GHz", "cpu_cores_logical": 2, "device": "cpu", "gpus": [],
           "hostname": "box-a"}
H100_ENV = {"cpu_model": "AMD EPYC 9454 48-Core Processor", "cpu_cores_logical": 96, "device": "cuda:0",
            "world_size": 1, "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_gb": 79.2}]}
CONFIG = {"preset": "tiny", "train": {"seed": 1, "system": {"precision": "fp32"}, "eval": {"split": "dev-clean"}}}


def _features(path):
    path.mkdir(parents=True)
    (path / "features.json").write_text("{}")
    return path


def test_labels_name_machine_preset_and_precision():
    assert short_gpu("NVIDIA H100 80GB HBM3") == "H100" and short_gpu("NVIDIA GeForce RTX 4090") == "RTX4090"
    assert short_gpu("AMD Instinct MI300X") == "MI300X" and short_gpu("NVIDIA A100-SXM4-80GB") == "A100"
    assert short_cpu("Intel(R) Xeon(R) CPU @ 2.20GHz") == "Xeon" and short_cpu("AMD EPYC 7B13") == "EPYC"
    assert default_label(CPU_ENV, CONFIG) == "2-core Xeon tiny fp32"
    assert default_label(H100_ENV, {"preset": "paper", "train": {"system": {"precision": "bf16"}}}) == "H100x1 paper bf16"
    assert machine_name({**H100_ENV, "device": "cpu"}) == "96-core EPYC"  # GPUs present but unused


def test_create_open_and_colliding_labels(tmp_path):
    feats = _features(tmp_path / "feats")
    a = Run.create(tmp_path / "a", kind="train", config=CONFIG, env=CPU_ENV, data=feats)
    b = Run.create(tmp_path / "b", kind="train", config=CONFIG, env=CPU_ENV, data=feats)
    c = Run.create(tmp_path / "c", kind="train", config=CONFIG, env=CPU_ENV, data=feats, label="mine")
    for r in (a, b, c):
        r.close()
    runs = [RunView.open(tmp_path / n) for n in "abc"]
    assert [r.info["format"] for r in runs] == [FORMAT] * 3 and runs[0].features() == feats
    assert unique_labels(runs) == ["2-core Xeon tiny fp32 [a]", "2-core Xeon tiny fp32 [b]", "mine"]
    assert runs[0].rows.row()["label"] == "2-core Xeon tiny fp32"
    assert not hasattr(runs[0].rows, "upsert") and not hasattr(runs[0].log, "append_sentences")  # a view reads only
    for r in runs:
        r.close()


def test_a_moved_folder_finds_its_features_beside_it_and_never_elsewhere(tmp_path, monkeypatch):
    feats = _features(tmp_path / "one" / "feats")
    Run.create(tmp_path / "one" / "run", kind="train", config=CONFIG, env=CPU_ENV, data=feats).close()
    shutil.move(tmp_path / "one", tmp_path / "two")  # run and features moved together
    monkeypatch.chdir(tmp_path)
    run = RunView.open(tmp_path / "two" / "run")
    assert run.features() == tmp_path / "two" / "feats"
    shutil.rmtree(tmp_path / "two" / "feats")
    with pytest.raises(SpeechperfError, match=r"its features folder is not here \(recorded as .*feats.* on box-a\); "
                                              "give --data FEATS"):
        run.features()
    other = _features(tmp_path / "elsewhere")
    assert RunView.open(tmp_path / "two" / "run", data=other).features() == other
    with pytest.raises(SpeechperfError, match="nowhere is not a prepared features folder"):
        RunView.open(tmp_path / "two" / "run", data=tmp_path / "nowhere").features()


def test_newer_format_and_broken_folders_are_named(tmp_path):
    run = Run.create(tmp_path / "run", kind="train", config=CONFIG, env=CPU_ENV)
    run.close()
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    (tmp_path / "run" / "run.json").write_text(json.dumps({**info, "format": FORMAT + 1}))
    with pytest.raises(SpeechperfError, match=f"written by a newer speechperf \\(run folder format {FORMAT + 1}"):
        RunView.open(tmp_path / "run")
    (tmp_path / "run" / "run.json").write_text(json.dumps(info))
    (tmp_path / "run" / "results.db").unlink()
    with pytest.raises(SpeechperfError, match="no results database at .*run/results.db"):
        RunView.open(tmp_path / "run").rows.row()
    (tmp_path / "run" / "results.db").write_bytes(b"garbage" * 200)
    with pytest.raises(SpeechperfError, match="run/results.db is not a readable results database"):
        RunView.open(tmp_path / "run").rows.row()
    with pytest.raises(SpeechperfError, match="not a run folder"):
        RunView.open(tmp_path)


def test_a_run_json_of_another_format_is_refused_by_name(tmp_path):
    run = Run.create(tmp_path / "run", kind="train", config=CONFIG, env=CPU_ENV)
    run.close()
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    for bad in ({k: v for k, v in info.items() if k != "format"}, {**info, "format": 1}):
        (tmp_path / "run" / "run.json").write_text(json.dumps(bad))
        with pytest.raises(SpeechperfError, match=f"run/run.json: run folder format .*; this speechperf reads format {FORMAT} only"):
            RunView.open(tmp_path / "run")


def _writer(args):
    folder, shared, n = args
    run = Run.create(folder, kind="train", config=CONFIG, env=CPU_ENV, shared_db=shared)
    for i in range(n):
        run.rows.add_iteration({"iteration": i + 1, "epoch": 1, "clock_s": float(i), "loss": 1.0, "batch_size": 4,
                           "frames": 10, "audio_s": 1.0, "step_s": 0.1, "utts_per_s": 40.0, "audio_s_per_s": 10.0})
        if i % 5 == 4:
            run.rows.flush()  # many small transactions: the writers interleave
    run.rows.set_status("success")
    run.close()
    return run.run_id


def test_concurrent_writers_lose_no_row(tmp_path):
    shared, n, procs = tmp_path / "shared.db", 150, 4
    with multiprocessing.get_context("spawn").Pool(procs) as pool:
        ids = pool.map(_writer, [(tmp_path / f"run{k}", shared, n) for k in range(procs)])
    with ResultsDB(shared, readonly=True) as db:
        assert sorted(r["run_id"] for r in db.query("SELECT run_id FROM runs WHERE status = 'success'")) == sorted(ids)
        counts = {r["run_id"]: r["n"] for r in db.query("SELECT run_id, COUNT(*) AS n FROM iterations GROUP BY run_id")}
    assert counts == {i: n for i in ids}
    for k, run_id in enumerate(sorted(ids)):  # and each folder's own database holds its own rows only
        with RunView.open(tmp_path / f"run{k}") as r:
            assert len(r.rows.iterations()) == n and {x["run_id"] for x in r.rows.iterations()} == {r.run_id}


def test_progress_ignores_unknown_fields():
    assert Progress.from_dict({"epoch": 3, "train_s": 1.0}).epoch == 3


def test_labels_name_the_data_parallel_algorithm_and_the_processes():
    config = {"preset": "tiny", "train": {"system": {"precision": "fp32"}}}
    two = {**CPU_ENV, "world_size": 2}
    assert default_label(two, {**config, "algo": {"name": "bmuf", "sync_every": 20}}) == "2-core Xeon tiny fp32 bmuf/20 x2"
    assert default_label(two, {**config, "algo": {"name": "sync", "sync_every": 1}}) == "2-core Xeon tiny fp32 sync x2"
    for name in ("sync", "single"):  # one process: no algorithm named
        assert default_label(CPU_ENV, {**config, "algo": {"name": name, "sync_every": 1}}) == "2-core Xeon tiny fp32"


def test_a_database_without_the_communication_columns_reads_and_gets_them_when_written(tmp_path):
    import sqlite3

    from speechperf.results import ResultsDB

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as c:  # iterations as the release before the data-parallel algorithms wrote them
        c.execute("CREATE TABLE iterations (run_id TEXT, iteration INTEGER, epoch INTEGER, clock_s REAL, loss REAL, "
                  "batch_size INTEGER, frames INTEGER, audio_s REAL, step_s REAL, utts_per_s REAL, audio_s_per_s REAL, "
                  "model_flops REAL, PRIMARY KEY (run_id, iteration))")
        c.execute("INSERT INTO iterations VALUES ('r', 1, 1, 1.0, 2.0, 4, 400, 4.0, 0.5, 8.0, 8.0, 1e9)")
    with ResultsDB(path, readonly=True) as db:
        assert "comm_s" not in db.query("SELECT * FROM iterations")[0]
    with ResultsDB(path) as db:
        assert db.query("SELECT comm_s, comm_bytes FROM iterations") == [{"comm_s": None, "comm_bytes": None}]
