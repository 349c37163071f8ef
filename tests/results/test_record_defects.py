"""Defects a fault probe found in reading and writing run records (issue 30, part 7): each
case exits as README documents (2: bad input, named; 1: a failed run), never with a raw
traceback, and never leaves a success whose rows are not written."""
import json
from types import SimpleNamespace
import sqlite3

import pytest

from speechperf.cli import main
from speechperf.metric import DEFAULT_TARGET
from speechperf.studies import rcp, study
from speechperf.results.run import Run
from speechperf.results.view import RunView

CONFIG = {"preset": "tiny", "model": {"name": "ds2"},
          "train": {"seed": 1, "eval": {"split": "dev-clean"},
                    "stop": {"target_metric": DEFAULT_TARGET, "target": 0.0, "target_epochs": 3}}}
ENV = {"cpu_model": "Test CPU", "cpu_cores_logical": 2, "gpus": []}
DEEP = "[" * 10_000 + "]" * 10_000  # deeper than Python's recursion limit: json.loads raises RecursionError


def _finished_run(folder):
    with Run.create(folder, kind="train", config=CONFIG, env=ENV, label="probe") as run:
        run.rows.set_status("success")
        run.write_summary({"status": "success", "init_s": 1.0})
    return folder


# ---- 1. a JSON file nested deeper than the parser's recursion ------------------------------
@pytest.mark.parametrize("name", ["run.json", "config.json", "env.json", "summary.json"])
@pytest.mark.parametrize("reader", ["tta", "report", "eval", "train"])
def test_a_deeply_nested_json_file_is_refused_by_name(reader, name, tmp_path, capsys):
    run = _finished_run(tmp_path / "run")
    (run / name).write_text('{"x": ' + DEEP + "}")
    argv = {"tta": ["tta", str(run)], "report": ["report", str(run), "--out", str(tmp_path / "rep")],
            "eval": ["eval", str(run)],
            "train": ["train", "--preset", "tiny", "--out", str(run), "threads=1"]}[reader]  # resume reads it
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{run / name}: nested too deeply" in err, err


@pytest.fixture
def reference(tmp_path, monkeypatch):
    """The shipped reference of preset refd (in a temporary RCP_DIR), written as given."""
    monkeypatch.setattr(rcp, "RCP_DIR", tmp_path)
    good = {"format": rcp.FORMAT, "preset": "refd", "metric": "cer", "window": 3, "targets": [10.0],
            "recipe": rcp.recipe(CONFIG), "corpus": {"fingerprint": {}},
            "seeds": [{"seed": s, "epochs": {"10": 9}} for s in range(1, 6)]}

    def write(**fields):
        (tmp_path / "refd.json").write_text(json.dumps({**good, **fields}))
        return tmp_path / "refd.json"
    return write


@pytest.mark.parametrize("fields,said", [
    ({"recipe": "abc"}, "field 'recipe' should be an object, found str 'abc'"),
    ({"seeds": ["s1"]}, "field 'seeds[0]' should be an object, found str 's1'"),
    ({"seeds": [{"seed": 1, "epochs": [9]}]}, "field 'seeds[0].epochs' should be an object, found list"),
    ({"corpus": {"fingerprint": 3}}, "field 'corpus.fingerprint' should be an object"),
    ({"targets": "10"}, "field 'targets' should be a list"),
    ("deep", "nested too deeply"),
])
def test_a_damaged_reference_file_is_refused_naming_file_and_field(reference, fields, said):
    from speechperf.studies.aggregate import SeedRun, aggregate

    if fields == "deep":  # written as text (json.dumps cannot write it either)
        path = reference()
        path.write_text(path.read_text()[:-1] + ', "recipe": {"x": ' + DEEP + "}}")
    else:
        path = reference(**fields)
    cfg = {**CONFIG, "preset": "refd"}
    runs = [SeedRun("s1", "ds2", "m", cfg, "max_epochs", ((60.0, 9.0), (120.0, 9.0), (180.0, 9.0)), {})]
    with pytest.raises(rcp.ReferenceError) as e:
        aggregate(runs, lambda r: (10.0,), "cer", 3)
    assert e.value.exit_code == 2 and str(path) in str(e.value) and said in str(e.value), str(e.value)
    finished = SimpleNamespace(config=cfg, env={}, folder=path.parent, rows=SimpleNamespace(evals=list))  # the Run's reads
    assert said in study.run_check(finished, "success")["check"]  # a finishing run names it, never raises


# ---- 3. another program's SQLite file where a run's results.db should be --------------------
@pytest.fixture(scope="module")
def trained(tiny_features, tmp_path_factory):
    """One finished tiny run (one epoch); tests copy it."""
    from speechperf.train.loop import TrainRequest, train

    run = tmp_path_factory.mktemp("trained") / "run"
    train(TrainRequest("tiny", tiny_features, run, ["threads=1", "max_epochs=1", "train.eval.final_splits=none"], quiet=True))
    return run


def _foreign_db(path):
    """Another program's database: a table of its own called runs, and one row."""
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, name TEXT)")
        db.execute("INSERT INTO runs (name) VALUES ('theirs')")
    db.close()
    return path.read_bytes()


def test_beam_sweep_refuses_another_programs_database_and_leaves_it_unchanged(trained, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    before = _foreign_db(run / "results.db")
    assert main(["beam-sweep", str(run), "--widths", "1", "--decoder", "greedy"]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'results.db'} is not a speechperf results database" in err, err
    assert (run / "results.db").read_bytes() == before and not (run / "results.db-wal").exists()


def test_every_writer_checks_the_database_before_writing(tmp_path):
    """One check in the results layer (ResultsDB opened for writing: the run's own database, a
    shared --db, bench's --db): a foreign file is refused unchanged; an empty file, a new one and
    a database of the first release (its runs table, no newer columns) are speechperf's."""
    from speechperf.results.db import ResultsDB, ResultsError

    before = _foreign_db(tmp_path / "theirs.db")
    with pytest.raises(ResultsError, match=r"theirs.db is not a speechperf results database \(its runs table lacks"):
        ResultsDB(tmp_path / "theirs.db")
    assert (tmp_path / "theirs.db").read_bytes() == before
    with sqlite3.connect(tmp_path / "other.db") as db:
        db.execute("CREATE TABLE users (name TEXT)")
    db.close()
    with pytest.raises(ResultsError, match="other.db is not a speechperf results database"):
        ResultsDB(tmp_path / "other.db")
    (tmp_path / "empty.db").touch()
    ResultsDB(tmp_path / "empty.db").close()
    ResultsDB(tmp_path / "new.db").close()
    with sqlite3.connect(tmp_path / "first.db") as db:  # the first release's runs table
        db.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, kind TEXT NOT NULL, preset TEXT, seed INTEGER, "
                   "platform TEXT, out_dir TEXT, config_json TEXT, env_json TEXT, started_at REAL, status TEXT)")
    db.close()
    with ResultsDB(tmp_path / "first.db") as db:
        assert "label" in {r["name"] for r in db.query("PRAGMA table_info(runs)")}


# ---- 2. a shared database (--db) that cannot be written ------------------------------------
TRAIN = ["threads=1", "max_epochs=1", "train.eval.final_splits=none"]  # as the trained fixture


def _runs_row(db_path, run_id):
    with sqlite3.connect(db_path) as db:
        row = db.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchone()
    db.close()
    return row


def test_a_refused_shared_db_is_checked_before_the_run_folder_exists(tiny_features, tmp_path, capsys):
    run, shared = tmp_path / "run", tmp_path / "shared.db"
    shared.write_text("a text file, not a database\n")
    argv = ["train", "--preset", "tiny", "--data", str(tiny_features), "--out", str(run), "--db", str(shared), *TRAIN]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert str(shared) in err and "Traceback" not in err, err
    assert not run.exists()  # nothing created before the input is accepted
    shared.unlink()  # the cause fixed: the same command trains, and both databases hold the run
    assert main(argv) == 0
    with RunView.open(run) as r:
        assert r.rows.row()["status"] == "success" and _runs_row(shared, r.run_id) == ("success",)


def _can_mount() -> bool:
    import os
    import shutil
    import subprocess

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_mount(), reason="needs root and a private mount namespace (unshare -m)")
def test_a_shared_db_in_a_read_only_folder_is_refused_before_the_run_folder_exists(tiny_features, tmp_path):
    import subprocess
    import sys

    run, ro = tmp_path / "run", tmp_path / "ro"
    ro.mkdir()
    train = [sys.executable, "-m", "speechperf", "train", "--preset", "tiny", "--data", str(tiny_features), "--out",
             str(run), "--db", str(ro / "shared.db"), *TRAIN]
    script = f"mount -t tmpfs tmpfs {ro} && mount -o remount,ro {ro} && exec {' '.join(train)}"
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 2 and f"{ro / 'shared.db'} cannot be written" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and not run.exists()


def test_a_run_left_without_its_row_is_recovered_by_the_same_command(trained, tiny_features, tmp_path):
    """What a refused start left before this fix (config.json, env.json, run.json, a results.db
    without its runs row): the same command starts the run over and registers it, in the shared
    database too; never a success whose rows are missing."""
    import shutil

    run, shared = tmp_path / "run", tmp_path / "shared.db"
    shutil.copytree(trained, run)
    for name in ("checkpoint.pt", "summary.json", "events.log", "sentences.jsonl"):
        (run / name).unlink(missing_ok=True)
    with sqlite3.connect(run / "results.db") as db:
        for table in ("runs", "iterations", "evals", "samples"):
            db.execute(f"DELETE FROM {table}")
    db.close()
    argv = ["train", "--preset", "tiny", "--data", str(tiny_features), "--out", str(run), "--db", str(shared), *TRAIN]
    assert main(argv) == 0
    with RunView.open(run) as r:
        assert r.rows.row()["status"] == "success" and r.rows.evals() and _runs_row(shared, r.run_id) == ("success",)


def test_a_resumed_run_registers_itself_in_a_new_shared_db(trained, tiny_features, tmp_path):
    import shutil

    run, shared = tmp_path / "run", tmp_path / "shared.db"
    shutil.copytree(trained, run)
    (run / "summary.json").unlink()  # as if killed after its last checkpoint
    argv = ["train", "--preset", "tiny", "--data", str(tiny_features), "--out", str(run), "--db", str(shared), *TRAIN]
    assert main(argv) == 0
    with RunView.open(run) as r:
        assert _runs_row(shared, r.run_id) == ("success",)


def test_a_trained_run_without_its_row_is_refused_by_a_writer_naming_the_database(tmp_path):
    from speechperf.results.formats import RunError

    run = _finished_run(tmp_path / "run")
    with sqlite3.connect(run / "results.db") as db:
        db.execute("DELETE FROM runs")
    db.close()
    (run / "checkpoint.pt").write_bytes(b"weights")  # it trained: its rows cannot be made up again
    with pytest.raises(RunError, match=r"is not in .*results.db: its rows are missing"):
        Run.open(run)
