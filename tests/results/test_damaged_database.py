"""Issue 48: a run folder whose results.db is not speechperf's (an empty file, text, another program's
database) is refused by every command, exit 2 naming the file, and left byte for byte as it was (a
writer once made an empty file a database; ``eval``, which reads no row, exited 0)."""
import shutil
import sqlite3

import pytest

from speechperf.cli import main
from speechperf.results.db import ResultsDB, ResultsError


def _foreign(path):
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE songs (title TEXT)")
    c.close()


DAMAGE = {"empty": (lambda p: p.write_bytes(b""), "is not a readable results database (an empty file)"),
          "text": (lambda p: p.write_text("hello\n" * 20), "is not a readable results database (it does not begin with SQLite"),
          "foreign": (_foreign, "is not a speechperf results database (it holds songs, no table of speechperf's)")}
COMMANDS = {"eval": ["eval", "RUN", "--split", "dev-clean", "--decoder", "greedy"],
            "beam-sweep": ["beam-sweep", "RUN", "--widths", "1", "--decoder", "greedy"], "tta": ["tta", "RUN"]}


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_run_whose_database_is_not_speechperf_s_is_refused_unchanged(tiny_run, tmp_path, capsys, damage, command):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    db = run / "results.db"
    db.unlink()
    make, says = DAMAGE[damage]
    make(db)
    before = db.read_bytes()
    assert main([str(run) if a == "RUN" else a for a in COMMANDS[command]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{db} {says}" in err, err
    assert db.read_bytes() == before
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in tiny_run.iterdir())  # no -wal, -shm


def test_a_writer_refuses_a_text_file_before_sqlite_reads_it(tmp_path):
    db = tmp_path / "shared.db"
    db.write_text("not a database")
    with pytest.raises(ResultsError, match="does not begin with SQLite's header"):
        ResultsDB(db)
    assert db.read_text() == "not a database"
    ResultsDB(tmp_path / "new.db").close()  # a new file, and an empty one, become databases
    (tmp_path / "empty.db").touch()
    ResultsDB(tmp_path / "empty.db").close()
