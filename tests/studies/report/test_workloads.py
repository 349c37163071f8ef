"""Runs of different workloads (models) are never ranked as one benchmark: the TTA table is
grouped per workload and a run's relative % is against its own workload's runs only; the
report draws one TTA table per workload, says why, and names each run's workload (model,
parameter count) in every table and figure."""
import csv
import re

import pytest

from speechperf.cli import main
from speechperf.studies.tta import tta_table
from speechperf.studies.report import figures
from speechperf.studies.report.html import build_report
from speechperf.results.run import Run
from speechperf.results.workload import workload, workload_label

ENV = {"cpu_model": "Test CPU", "cpu_cores_logical": 2, "gpus": []}
DS2 = {"name": "ds2", "conv_channels": 8, "lstm_layers": 1, "lstm_hidden": 8}
CONFORMER = {"name": "conformer"}


def _run(root, name: str, model: dict, cers: list[float]):
    config = {"preset": name, "model": model, "train": {"seed": 1, "eval_split": "dev-clean"}}
    with Run.create(root / name, kind="train", config=config, env=ENV, label=name) as run:
        for n in range(20):
            run.rows.add_iteration({"iteration": n, "epoch": n // 5 + 1, "clock_s": 15.0 * n, "loss": 10.0 / (n + 1),
                               "batch_size": 4, "frames": 400, "audio_s": 4.0, "step_s": 1.0, "utts_per_s": 4.0,
                               "audio_s_per_s": 4.0})
        run.rows.insert("evals", [{"run_id": run.run_id, "epoch": e, "split": "dev-clean", "decoder": "greedy", "beam": 1,
                              "clock_s": 60.0 * e, "eval_s": 1.0, "loss": 1.0, "wer": 2 * c, "cer": c, "cer_paper": c,
                              "n_utts": 5, "final": 0} for e, c in enumerate(cers, 1)])
    return root / name


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("workloads")
    # CER 10 reached at minute 4 (ds2-a), 3 (conformer: fastest, but another job), 6 (ds2-b)
    return [_run(root, "ds2-a", DS2, [30, 12, 9, 9]), _run(root, "conf", CONFORMER, [20, 9, 9, 9]),
            _run(root, "ds2-b", DS2, [30, 20, 20, 12, 9, 9])]


def test_the_tta_table_ranks_within_a_workload_only(runs, capsys):
    ds2, conformer = workload_label(workload({"model": DS2})), workload_label(workload({"model": CONFORMER}))
    assert ds2.startswith("ds2, ") and ds2.endswith(" M params") and conformer.startswith("conformer")
    rows = [r for r in tta_table(runs, targets=[10]) if r["target"] == 10]
    assert [(r["run"], r["workload"], r["minutes"], r["relative"]) for r in rows] == [
        ("ds2-a", ds2, 4.0, 100.0), ("ds2-b", ds2, 6.0, 150.0), ("conf", conformer, 3.0, 100.0)]
    assert main(["tta", *map(str, runs), "--targets", "10"]) == 0
    assert f"2 workloads, each run ranked within its own: {ds2}; {conformer}" in capsys.readouterr().out
    assert main(["tta", *map(str, runs), "--targets", "10", "--wide"]) == 0
    out = capsys.readouterr().out
    assert f"2 workloads ({ds2}; {conformer}): different jobs, not ranked against each other" in out


def test_the_report_has_one_tta_table_per_workload_and_says_why(runs, tmp_path, monkeypatch):
    texts = []  # every figure's legends, titles and labelled bars
    save = figures.save_png
    monkeypatch.setattr(figures, "save_png", lambda fig, path: texts.append(" ".join(
        t.get_text() for ax in fig.axes for t in [ax.title, *ax.get_yticklabels(), *(ax.get_legend().get_texts() if ax.get_legend() else [])]))
        or save(fig, path))
    page = build_report(runs, tmp_path / "rep").read_text()
    ds2, conformer = workload_label(workload({"model": DS2})), workload_label(workload({"model": CONFORMER}))
    assert f"These runs train 2 different workloads ({ds2}; {conformer})" in page
    assert "is not ranked against another" in page
    tables = sorted(p.name for p in (tmp_path / "rep").glob("tta*.csv"))
    assert len(tables) == 2 and not (tmp_path / "rep" / "tta.csv").exists()
    by_table = {}
    for name in tables:
        with open(tmp_path / "rep" / name, newline="") as f:
            by_table[name] = list(csv.DictReader(f))
    for rows in by_table.values():
        assert len({r["workload"] for r in rows}) == 1  # one workload per table
        ref = {r["reference"] for r in rows if r["metric"] == "CER" and r["target %"] == "10.0"}
        assert ref <= {r["run"] for r in rows}  # the reference is a run of the same workload
    ds2_rows = next(rows for rows in by_table.values() if rows[0]["workload"] == ds2)
    cer10 = {r["run"]: r for r in ds2_rows if r["metric"] == "CER" and r["target %"] == "10.0"}
    assert float(cer10["ds2-b"]["relative %"]) == pytest.approx(150.0) and cer10["ds2-b"]["reference"] == "ds2-a"
    with open(tmp_path / "rep" / "runs.csv", newline="") as f:
        assert {r["run"]: r["workload"] for r in csv.DictReader(f)} == {"ds2-a": ds2, "conf": conformer, "ds2-b": ds2}
    for text in texts:  # each figure names each run beside its workload
        assert all(re.search(re.escape(f"{label} ({w})"), text) for label, w in
                   (("ds2-a", ds2), ("conf", conformer), ("ds2-b", ds2))), text
