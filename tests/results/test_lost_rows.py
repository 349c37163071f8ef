"""Issue 61: a run folder whose database lost rows (copied without results.db-wal, say) is never read
or continued as if whole. ``train`` refuses to continue it (exit 2, naming both counts and files,
nothing cut), and ``tta`` refuses to report it: its rows are compared with what the checkpoint, the
summary or, for a killed run, events.log says the run did."""
import json
import shutil
import sqlite3

import pytest

from speechperf.results.formats import RunError
from speechperf.studies.tta import tta_table
from tests.conftest import TINY_RUN, cli


@pytest.fixture
def lost(tiny_run, tmp_path):
    """The session's finished run with its iterations after the 3rd and its epoch-2 evaluation lost."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    con = sqlite3.connect(run / "results.db")
    with con:
        con.execute("DELETE FROM iterations WHERE iteration > 3")
        con.execute("DELETE FROM evals WHERE epoch = 2 AND final = 0")
    con.close()
    return run


def test_tta_refuses_a_run_whose_rows_are_fewer_than_its_summary_says(lost):
    done = json.loads((lost / "summary.json").read_text())
    with pytest.raises(RunError, match=rf"holds 3 of the {done['iterations']} iterations and 1 of the 2 evaluations "
                                       rf"that {lost / 'summary.json'} records") as e:
        tta_table([lost])
    assert e.value.exit_code == 2 and str(lost / "results.db") in str(e.value)


def test_tta_refuses_a_killed_run_whose_rows_are_fewer_than_its_events_log_says(lost):
    (lost / "summary.json").unlink()  # killed: no summary, its events.log says how far it got
    with pytest.raises(RunError, match=rf"of the 2 evaluations that {lost / 'events.log'} records"):
        tta_table([lost])


def test_train_refuses_to_continue_over_a_database_that_lost_rows(lost, tiny_features):
    (lost / "summary.json").unlink()  # a run to continue from its checkpoint
    before = (lost / "results.db").read_bytes()
    p = cli("train", "--data", tiny_features, "--out", lost, *TINY_RUN, timeout=300)
    assert p.returncode == 2, p.stderr
    assert "holds 3 of the" in p.stderr and f"{lost / 'checkpoint.pt'} records" in p.stderr
    assert str(lost / "results.db") in p.stderr and "Traceback" not in p.stderr
    assert (lost / "results.db").read_bytes() == before  # nothing cut, nothing marked running
