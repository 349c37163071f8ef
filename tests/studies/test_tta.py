import json

import pytest

from speechperf.errors import SpeechperfError
from speechperf.scoring.target_rule import tta_minutes
from speechperf.studies.tta import tta_table
from speechperf.results import ResultsDB


def test_median_of_last_three_epochs():
    evals = [(60, 30.0), (120, 9.0), (180, 20.0), (240, 9.5), (300, 9.0)]
    # windows: [30,9,20] -> 20; [9,20,9.5] -> 9.5; reached at epoch 4 (240 s)
    assert tta_minutes(evals, 10.0, 3) == pytest.approx(4.0)
    assert tta_minutes(evals, 9.0, 3) is None
    assert tta_minutes(evals, 9.0, 1) == pytest.approx(2.0)


def test_needs_e_epochs_before_reaching():
    assert tta_minutes([(60, 1.0), (120, 1.0)], 10.0, 3) is None
    with pytest.raises(SpeechperfError):
        tta_minutes([], 1.0, 0)


def _fake_run(tmp_path, name, evals):
    run = tmp_path / name
    run.mkdir()
    db_path = run / "results.db"
    (run / "run.json").write_text(json.dumps({"format": 2, "run_id": name, "label": f"run {name}"}))
    (run / "config.json").write_text(json.dumps({"train": {"eval_split": "dev-clean"}}))
    (run / "env.json").write_text(json.dumps({"cpu_model": "Test CPU", "cpu_cores_logical": 2}))
    with ResultsDB(db_path) as db:
        db.upsert("runs", {"run_id": name, "kind": "train", "config_json": {"train": {"eval_split": "dev-clean"}}})
        for epoch, (clock, cer) in enumerate(evals, 1):
            db.upsert("evals", {"run_id": name, "epoch": epoch, "split": "dev-clean", "decoder": "greedy", "beam": 1,
                                "clock_s": clock, "eval_s": 1.0, "loss": 1.0, "wer": 2 * cer, "cer": cer,
                                "cer_paper": cer, "n_utts": 10, "final": 0})
        # a final evaluation and another split must not count
        db.upsert("evals", {"run_id": name, "epoch": 99, "split": "dev-clean", "decoder": "greedy", "beam": 1,
                            "clock_s": 1.0, "eval_s": 1.0, "loss": 1.0, "wer": 0.0, "cer": 0.0, "cer_paper": 0.0,
                            "n_utts": 10, "final": 1})
    return run


def test_table_relative_to_first_run(tmp_path):
    a = _fake_run(tmp_path, "a", [(600, 12), (1200, 9), (1800, 9), (2400, 7)])
    b = _fake_run(tmp_path, "b", [(300, 9), (600, 9), (900, 9), (1200, 9)])
    rows = tta_table([a, b], metric="cer", targets=[10, 8], epochs=3)
    assert [(r["run"][-1], r["target"], r["minutes"], r["relative"], r["epochs to target"]) for r in rows] == [
        ("a", 10, 30.0, 100.0, 3), ("a", 8, None, None, None), ("b", 10, 15.0, 50.0, 3), ("b", 8, None, None, None)]
    assert rows[0]["median of"] == 3  # the rule's window (epochs), not the epochs trained
    assert set(rows[0]) >= {"run", "machine", "metric", "target", "minutes", "relative", "init s",
                            "platform", "cost to accuracy $", "TTA x price ($ min)", "price note"}
    assert rows[0]["run"] == "run a" and rows[0]["machine"] == "2-core Test"
    # a CPU that no profile prices: no price, and the row says why
    assert rows[0]["cost to accuracy $"] is None and "no price for Test CPU" in rows[0]["price note"]


def test_table_prices_each_run_from_its_environment_and_overrides(tmp_path, capsys):
    from speechperf.cli import main

    h100 = _fake_run(tmp_path, "h100", [(600, 9), (1200, 9), (1800, 9)])  # CER 10 at 30 min
    (h100 / "env.json").write_text(json.dumps({"cpu_model": "x", "gpus": [{"name": "NVIDIA H100 80GB HBM3"}] * 2}))
    odd = _fake_run(tmp_path, "odd", [(600, 9), (1200, 9), (1800, 9)])
    (odd / "env.json").write_text(json.dumps({"cpu_model": "x", "gpus": [{"name": "NVIDIA B300"}]}))
    rows = {r["run"][-3:]: r for r in tta_table([h100, odd], targets=[10])}
    assert rows["100"]["platform"] == "2x NVIDIA H100 SXM 80 GB"
    assert rows["100"]["cost to accuracy $"] == pytest.approx(0.5 * 2 * 3.99)
    assert rows["100"]["TTA x price ($ min)"] == pytest.approx(30 * 2 * 25000.0)
    assert rows["odd"]["cost to accuracy $"] is None
    assert "no price for 1x NVIDIA B300; give --price-per-hour" in rows["odd"]["price note"]
    assert main(["tta", str(h100), str(odd), "--targets", "10", "--price-per-hour", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["runs"]
    assert [r["cost to accuracy $"] for r in out] == [2.0, 2.0]


def test_the_reference_is_exactly_100_percent_of_itself():
    """The CPU demo's report read 99.99999999999999 % for its own reference run (12.8338... min):
    100 x m / m rounds; 100 x (m / m) does not."""
    from speechperf.scoring.target_rule import relative_pct

    m = 12.833805918266929
    assert 100 * m / m != 100.0 and relative_pct(m, m) == 100.0
    assert relative_pct(None, m) is None and relative_pct(m, None) is None and relative_pct(3.0, 2.0) == 150.0


def test_each_run_shows_its_precision_and_different_ones_are_each_at_their_best(tmp_path, capsys):
    from speechperf.cli import main
    from speechperf.studies import tta_text
    from speechperf.studies.tta import notes

    a = _fake_run(tmp_path, "a", [(600, 9), (1200, 9), (1800, 9)])
    b = _fake_run(tmp_path, "b", [(300, 9), (600, 9), (900, 9)])
    (b / "config.json").write_text(json.dumps({"train": {"eval_split": "dev-clean", "precision": "bf16"}}))
    choice = {"chosen": "bf16", "candidates": {"fp32": 0.4, "bf16": 0.25}, "cached": False, "seconds": 3.0}
    (b / "env.json").write_text(json.dumps({"cpu_model": "Test CPU", "cpu_cores_logical": 2,
                                            "precision_choice": choice}))
    rows = tta_table([a, b], targets=[10])
    assert [(r["precision"], r["precision by"]) for r in rows] == [("fp32", "given"), ("bf16", "auto")]
    short = tta_text.short_rows(rows)
    assert [r["prec"] for r in short] == ["fp32", "bf16"] and "prec" in tta_text.columns(short)  # labels lack it
    named = [{**r, "run": f"2-core EPYC cpu {r['prec']}"} for r in short]
    assert "prec" not in tta_text.columns(named)  # default labels say it: the column gives way to the others
    (line,) = [n for n in notes(rows) if "each at its best" in n]
    assert line.endswith("'relative' sets runs in different precisions side by side, each at its best (fp32, bf16): "
                         "not a like-for-like precision comparison")
    assert main(["tta", str(a), str(b), "--targets", "10", "--json"]) == 0
    assert [r["precision"] for r in json.loads(capsys.readouterr().out)["runs"]] == ["fp32", "bf16"]
    assert main(["tta", str(a), str(b), "--targets", "10"]) == 0
    assert "each at its best (fp32, bf16)" in " ".join(capsys.readouterr().out.split())  # a wrapped note
    assert not [n for n in notes(tta_table([a, a], targets=[10])) if "each at its best" in n]  # one precision
