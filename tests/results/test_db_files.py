"""Issue 61: a run folder's results.db is a file of the folder itself, read without writing.

A symbolic link there (or beside it: -wal, -shm) is refused by name before SQLite opens anything:
SQLite resolves the link and reads, and writes beside, the database outside the folder. A finished
run's database is complete in one file (rollback-journal mode): reading it creates no -wal or -shm
file, and opens in a folder it cannot write."""
import shutil
import sqlite3

import pytest

from speechperf.results import ResultsDB
from speechperf.results.db import ResultsError, read_uri
from speechperf.results.run import Run
from speechperf.results.view import RunView
from speechperf.studies.tta import tta_table


def _files(folder):
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}


@pytest.fixture
def copied(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    return run


@pytest.mark.parametrize("linked", ["results.db", "results.db-wal"])
def test_a_database_that_links_out_of_the_folder_is_refused_unread(copied, tmp_path, linked):
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "x.db"
    if linked == "results.db":
        (copied / "results.db").rename(target)
    else:
        sqlite3.connect(target).close()
    (copied / linked).symlink_to(target)
    before = _files(outside)
    for read in (lambda: tta_table([copied]), lambda: RunView.open(copied), lambda: Run.open(copied)):
        with pytest.raises(ResultsError, match=f"{copied / linked} is a symbolic link") as e:
            read()
        assert e.value.exit_code == 2
    assert _files(outside) == before  # no -wal or -shm beside the target, the target untouched


def test_reading_a_finished_run_writes_nothing(copied):
    head = (copied / "results.db").read_bytes()[:20]
    assert head[18] == head[19] == 1  # sealed as the run ended: rollback journal, no WAL
    before = _files(copied)
    assert tta_table([copied])
    with RunView.open(copied) as view:
        assert view.rows.iterations()
    assert _files(copied) == before


def test_a_wal_database_in_a_folder_that_cannot_be_written_is_read_immutable(tmp_path, monkeypatch):
    path = tmp_path / "results.db"
    with ResultsDB(path) as db:  # a writer leaves WAL mode on (an older run's file, say)
        db.upsert("runs", {"run_id": "r", "kind": "train", "status": "success"})
    assert not path.with_name("results.db-wal").exists()
    assert "immutable" not in read_uri(path)
    monkeypatch.setattr("os.access", lambda *a, **k: False)  # the folder read-only (root writes anyway)
    assert read_uri(path).endswith("mode=ro&immutable=1")
    with ResultsDB(path, readonly=True) as db:
        assert db.query("SELECT status FROM runs") == [{"status": "success"}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.db"]


def test_seal_leaves_a_database_another_connection_reads_in_wal_mode(tmp_path):
    path = tmp_path / "results.db"
    with ResultsDB(path) as db, ResultsDB(path, readonly=True) as reader:
        db.upsert("runs", {"run_id": "r", "kind": "train", "status": "running"})
        reader.conn.execute("BEGIN")
        reader.query("SELECT * FROM runs")  # a reader of the running run, mid-read
        assert db.seal() is False
        reader.conn.execute("COMMIT")
    with ResultsDB(path) as db:
        assert db.seal() is True
    assert path.read_bytes()[18] == 1
