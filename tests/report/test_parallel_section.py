"""The parallel section from a results database written as the sweep writes it: the table
and the CV-loss learning curves, or the reason when no run recorded per-epoch losses."""
import pytest

from speechperf.report import figures
from speechperf.report.html import render_section
from speechperf.report.sections import Context, Figure, parallel_section
from speechperf.results import ResultsDB

# (run_id, model, algo, workers, sync period, batch, CV loss per epoch)
RUNS = [("old-bsp", "dnn", "bsp", 2, 2, 4, [9.0, 8.0]),  # repeated below: the later run is drawn
        ("bsp", "dnn", "bsp", 2, 2, 4, [3.4, 3.2, 3.1]),
        ("bmuf", "dnn", "bmuf", 2, 2, 4, [3.6, 3.3, 3.0]),
        ("sync", "cldnn", "sync", 2, 1, 4, [3.5, 3.3]),
        ("single", "dnn", "single", 1, 1, 4, [])]  # no epochs rows: no line


def _db(path, with_epochs: bool) -> ResultsDB:
    db = ResultsDB(path)  # every table of results/schema.py exists from the start
    for run_id, model, algo, workers, tau, batch, losses in RUNS:
        db.upsert("parallel_runs", {"run_id": run_id, "algo": algo, "workers": workers, "sync_period": tau,
                                    "batch": batch, "model": model, "epochs": len(losses), "train_s": 2.0 * len(losses),
                                    "s_per_epoch": 2.0, "comm_s": 0.1, "comm_bytes": 1000, "syncs": 10,
                                    "cv_loss": losses[-1] if losses else None, "status": "success"})
        if with_epochs:
            db.insert_many("parallel_epochs", [{"run_id": run_id, "epoch": e + 1, "train_s": 2.0 * (e + 1),
                                                "cv_loss": loss, "lr": 0.2} for e, loss in enumerate(losses)])
    return db


def test_learning_curves_drawn_per_model_and_configuration(tmp_path, monkeypatch):
    drawn, save = [], figures._save
    monkeypatch.setattr(figures, "_save", lambda fig, path: drawn.append(fig) or save(fig, path))
    with _db(tmp_path / "results.db", with_epochs=True) as db:
        section = parallel_section(Context([], tmp_path, db))
    page = render_section(section, tmp_path)
    (fig,) = [b for b in section.blocks if isinstance(b, Figure)]
    assert fig.path == tmp_path / "parallel_cv.png" and fig.path.stat().st_size > 0
    assert '<img src="parallel_cv.png"' in page and (tmp_path / "parallel.csv").exists()
    cldnn_epoch, _, dnn_epoch, dnn_seconds = drawn[0].axes  # models in name order: cldnn, dnn
    assert [ln.get_label() for ln in cldnn_epoch.lines] == ["sync x2, tau 1, batch 4"]
    lines = {ln.get_label(): ln for ln in dnn_epoch.lines}
    assert set(lines) == {"bmuf x2, tau 2, batch 4", "bsp x2, tau 2, batch 4"}
    assert list(lines["bsp x2, tau 2, batch 4"].get_ydata()) == [3.4, 3.2, 3.1]  # the later run
    assert list(lines["bsp x2, tau 2, batch 4"].get_xdata()) == [1, 2, 3]
    assert [list(ln.get_xdata()) for ln in dnn_seconds.lines] == [[2.0, 4.0, 6.0]] * 2


@pytest.mark.parametrize("with_table", [True, False])
def test_without_epochs_the_figure_says_why(tmp_path, with_table):
    with _db(tmp_path / "results.db", with_epochs=False) as db:
        if not with_table:  # a database of a release before the sweep wrote per-epoch rows
            db.conn.execute("DROP TABLE parallel_epochs")
        section = parallel_section(Context([], tmp_path, db))
    page = render_section(section, tmp_path)
    assert not (tmp_path / "parallel_cv.png").exists() and "<img" not in page
    assert "Not shown (CV loss per epoch" in page
    assert "no parallel run recorded per-epoch CV losses (table parallel_epochs)" in page
