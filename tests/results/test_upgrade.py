"""A run folder recorded before a field existed is brought to the current fields in one step,
as it is opened (results/upgrade.py): its config.json's later train fields, its database's later
columns (None in older rows, a read-only database left byte for byte as it was)."""
import hashlib
import json
import sqlite3
from pathlib import Path

from speechperf.config.training import TrainConfig, target_rule
from speechperf.results import ResultsDB, schema, upgrade
from speechperf.results.run import Run
from speechperf.results.view import RunView
from speechperf.scoring.targets import run_protocol

ENV = {"cpu_model": "Test CPU", "cpu_cores_logical": 2, "gpus": []}
OLD_TRAIN = {"seed": 1, "eval_split": "dev-clean"}  # no protocol, no target fields
# A run folder of an earlier release (the GPU check's demo run): its evals lack the decode columns.
FIXTURE = Path(__file__).resolve().parents[1] / "benchmarks" / "fixtures" / "gpu_check" / "runs" / "demo" / "run"


def test_the_config_fields_hold_what_every_run_had_before_them():
    d = TrainConfig()
    assert upgrade.CONFIG_FIELDS == {("train", "protocol"): d.protocol,
                                     ("train", "stop", "target_metric"): d.stop.target_metric,
                                     ("train", "stop", "target"): d.stop.target,
                                     ("train", "stop", "target_epochs"): d.stop.target_epochs}


def test_config_fills_only_what_is_missing_and_leaves_the_record_alone():
    recorded = {"preset": "tiny", "train": {**OLD_TRAIN, "target": 12.5}}
    out = upgrade.config(recorded)
    assert out["train"] == {"seed": 1, "eval": {"split": "dev-clean"}, "protocol": "speechperf",
                            "stop": {"target": 12.5, "target_metric": TrainConfig().stop.target_metric,
                                     "target_epochs": 3}}
    assert recorded == {"preset": "tiny", "train": {**OLD_TRAIN, "target": 12.5}}  # not modified
    assert upgrade.config({"preset": "tiny"})["train"]["protocol"] == "speechperf"
    assert upgrade.config(out) == out  # a config of this release: as it is
    assert upgrade.config({"train": "x"}) == {"train": "x"}  # not an object: the shape checks refuse it


def test_a_run_opened_reads_the_later_config_fields(tmp_path):
    with Run.create(tmp_path / "r", kind="train", config={"preset": "tiny", "train": OLD_TRAIN}, env=ENV):
        pass
    run = RunView.open(tmp_path / "r")
    assert json.loads((tmp_path / "r" / "config.json").read_text())["train"] == OLD_TRAIN  # the file as it was
    assert run_protocol(run.config) == "speechperf"
    assert target_rule(run.config["train"]) == (TrainConfig().stop.target_metric, 0.0, 3)


def test_rows_of_a_database_without_the_later_columns_hold_none(tmp_path):
    before = hashlib.sha256((FIXTURE / "results.db").read_bytes()).hexdigest()
    run = RunView.open(FIXTURE)
    evals = run.rows.evals()
    assert evals and all(e[c] is None for e in evals for c in schema.EVALS_DECODE)
    assert all(set(upgrade.ADDED_COLUMNS["samples"]) <= set(s) for s in run.rows.samples())
    run.close()
    assert hashlib.sha256((FIXTURE / "results.db").read_bytes()).hexdigest() == before  # read-only: unchanged


def test_a_database_opened_for_writing_gets_the_later_columns(tmp_path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, kind TEXT, preset TEXT, seed INTEGER, platform TEXT, "
                 "out_dir TEXT, config_json TEXT, env_json TEXT, started_at REAL, status TEXT)")
    conn.execute("CREATE TABLE samples (run_id TEXT, t REAL, source TEXT, metric TEXT, value REAL)")
    conn.execute("INSERT INTO samples VALUES ('r', 1.0, 'cpu', 'util_pct', 50.0)")
    conn.commit()
    conn.close()
    db = ResultsDB(path)
    for table, columns in upgrade.ADDED_COLUMNS.items():
        have = {r["name"] for r in db.query(f"PRAGMA table_info({table})")}
        assert set(columns) <= have, (table, set(columns) - have)
    assert db.query("SELECT segment, label FROM samples, runs") == [] and \
        db.query("SELECT segment FROM samples") == [{"segment": None}]
    db.close()
