"""``speechperf eval`` and ``beam-sweep`` over a finished run folder (studies/evaluate_run.py):
the run's last weights evaluated again give the final evaluation it recorded; a sweep writes
one row per width, every declared metric in it, to the run's database, once per width."""
import shutil

import pytest
import torch

from speechperf import metric
from speechperf.results.view import RunView
from speechperf.studies.evaluate_run import beam_sweep, evaluate_run


@pytest.fixture
def one_thread():
    """The session's run trained and evaluated on one thread: the same sums, bit for bit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_eval_gives_the_final_evaluation_the_run_recorded(tiny_run, one_thread):
    with RunView.open(tiny_run) as r:
        (final,) = [e for e in r.rows.evals(final=True) if e["split"] == "dev-clean"]
    row = evaluate_run(tiny_run, split="dev-clean", decoder="greedy", workers=1)
    assert "pairs" not in row and (row["split"], row["decoder"], row["beam"]) == ("dev-clean", "greedy", 1)
    assert row["n_utts"] == final["n_utts"] > 0
    assert {c: row[c] for c in metric.columns()} == {c: final[c] for c in metric.columns()}  # intervals too
    assert row["loss"] == pytest.approx(final["loss"], rel=1e-6)


def test_a_beam_sweep_writes_one_row_per_width_with_every_declared_metric(tiny_run, tmp_path, one_thread):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)  # the sweep writes to the run's database
    rows = beam_sweep(run, [1, 4], split="dev-clean", decoder="beam", workers=1)
    assert [(r["beam"], r["decoder"], r["split"], r["device"]) for r in rows] == [(1, "beam", "dev-clean", "cpu"),
                                                                                   (4, "beam", "dev-clean", "cpu")]
    assert all(r[c] is not None for r in rows for c in metric.columns()) and all(r["eval_s"] > 0 for r in rows)
    with RunView.open(run) as r:
        assert [{k: s[k] for k in rows[0]} for s in r.rows.beam_sweep()] == rows  # stored as returned
    (again,) = beam_sweep(run, [4], split="dev-clean", decoder="beam", workers=1)
    with RunView.open(run) as r:
        stored = r.rows.beam_sweep()
    assert [s["beam"] for s in stored] == [1, 4] and stored[1]["eval_s"] == again["eval_s"]  # replaced, not added
