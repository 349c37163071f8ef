"""``speechperf tta`` over seeds of two machines: the --json shape and the text tables."""
import json

from speechperf.cli import main
from speechperf.results import ResultsDB


def _run(root, machine: str, seed: int, epoch_s: float, cers: list[float]):
    run = root / f"{machine}-s{seed}"
    run.mkdir()
    config = {"preset": "cpu", "model": {"name": "ds2", "conv_channels": 32, "lstm_layers": 1, "lstm_hidden": 32},
              "train": {"seed": seed, "eval_split": "dev-clean"}}
    (run / "run.json").write_text(json.dumps({"format": 2, "run_id": run.name, "label": f"{machine} cpu"}))
    (run / "config.json").write_text(json.dumps(config))
    (run / "env.json").write_text(json.dumps({"cpu_model": f"{machine} CPU", "cpu_cores_logical": 2}))
    with ResultsDB(run / "results.db") as db:
        db.upsert("runs", {"run_id": run.name, "kind": "train", "seed": seed, "config_json": config, "status": "max_epochs"})
        for epoch, cer in enumerate(cers, 1):
            db.upsert("evals", {"run_id": run.name, "epoch": epoch, "split": "dev-clean", "decoder": "greedy", "beam": 1,
                                "clock_s": epoch * epoch_s, "eval_s": 1.0, "loss": 1.0, "wer": 2 * cer, "cer": cer,
                                "cer_paper": cer, "n_utts": 10, "final": 0})
    return run


def test_tta_json_has_runs_groups_and_comparisons(tmp_path, capsys):
    runs = [_run(tmp_path, "Xeon", s, 60.0, [30, 20, 9, 9, 9, 9]) for s in (1, 2, 3)]  # CER 10 at epoch 4: 4 min
    runs += [_run(tmp_path, "EPYC", s, 30.0, [30, 20, 9, 9, 9, 9]) for s in (1, 2)]  # 2 min
    runs.append(_run(tmp_path, "EPYC", 3, 30.0, [30, 20, 20, 20, 20, 20]))  # never
    assert main(["tta", *map(str, runs), "--targets", "10", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"runs", "groups", "comparisons", "evaluations"}
    # rows without the evaluations' intervals (written before them) read as None, never refused
    assert out["evaluations"][0] == {"run": "Xeon cpu [Xeon-s1]", "epoch": 1, "clock_s": 60.0, "split": "dev-clean",
                                     "cer": 30, "cer_lo": None, "cer_hi": None, "wer": 60, "wer_lo": None,
                                     "wer_hi": None, "ser": None, "ser_lo": None, "ser_hi": None, "n_utts": 10}
    assert out["runs"][0]["error at TTA"] == 9 and out["runs"][0]["error 95% low"] is None
    assert [(r["run"][:4], r["epochs to target"], r["min/epoch"], r["minutes"]) for r in out["runs"]][::3] == [
        ("Xeon", 4, 1.0, 4.0), ("EPYC", 4, 0.5, 2.0)]
    assert out["runs"][-1]["state"] == "never reached" and out["runs"][-1]["RCP check"].startswith(
        "reference is for another recipe: ")  # hand-written configs, not the cpu preset its reference was measured with
    xeon, epyc = out["groups"]
    assert (xeon["group"], xeon["runs"], xeon["reached"], xeon["median TTA min"]) == ("2-core Xeon cpu", 3, 3, 4.0)
    assert (epyc["reached"], epyc["never reached"], epyc["epochs to target per seed"]) == (2, 1, "s1:4 s2:4 s3:never")
    (c,) = out["comparisons"]
    assert (c["A"], c["B"], c["95% high"]) == ("2-core Xeon cpu", "2-core EPYC cpu", "inf")  # 3 against 3 seeds: no 95% interval
    assert c["verdict"].startswith("not distinguishable at 3 and 3 seeds")
    assert main(["tta", *map(str, runs), "--targets", "10"]) == 0
    text = capsys.readouterr().out
    assert "Seeds per group" in text and "not distinguishable at 3 and 3 seeds" in text


def test_a_database_without_the_interval_columns_is_read_and_upgraded_on_write(tmp_path, capsys):
    """A results.db of a release before the evaluations' intervals: tta reads it (no interval),
    and opening it for writing (a resumed run) adds the columns."""
    import sqlite3

    run = _run(tmp_path, "Xeon", 1, 60.0, [30, 20, 9, 9, 9, 9])
    with sqlite3.connect(run / "results.db") as conn:
        for col in ("cer_lo", "cer_hi", "wer_lo", "wer_hi"):
            conn.execute(f"ALTER TABLE evals DROP COLUMN {col}")
    assert main(["tta", str(run), "--targets", "10"]) == 0
    text = capsys.readouterr().out
    assert "error [95%]" in text and " 9.0 " in text and "9.0 [" not in text  # the value, no interval
    assert main(["tta", str(run), "--targets", "10", "--wide"]) == 0
    text = capsys.readouterr().out
    assert "error at TTA [95%]" in text and " 9.00 " in text and "9.00 [" not in text
    assert main(["tta", str(run), "--targets", "10", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["evaluations"][0]["cer_lo"] is None
    with ResultsDB(run / "results.db") as db:
        assert {"cer_lo", "cer_hi", "wer_lo", "wer_hi"} <= {r["name"] for r in db.query("PRAGMA table_info(evals)")}
