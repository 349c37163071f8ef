"""MLPerf compliance of events.log (the real mlperf-logging checker) and the TTA clock
starting after initialization."""
import json
import subprocess
import sys
import time

import pytest

from speechperf.results import ResultsDB
from speechperf.train import loop, trainer
from speechperf.train.request import TrainRequest
from speechperf.results.events import read_events
from speechperf.results.mlperf import check_log

TINY = ["max_epochs=2", "threads=1", "checkpoint_every=3"]


def _train(feats, out, overrides=TINY, **kw):
    return loop.train(TrainRequest("tiny", feats, out, overrides, quiet=True, **kw))


def test_run_log_passes_the_compliance_checker(tiny_run):
    result = check_log(tiny_run / "events.log")
    assert result["ok"], result["output"]
    keys = [e["key"] for e in read_events(tiny_run / "events.log")]
    # initialization comes first and ends before the clock starts
    assert keys.index("init_start") == 0 and keys.index("init_stop") < keys.index("run_start")
    for key in ("submission_org", "submission_platform", "submission_division", "submission_benchmark",
                "cache_clear", "train_samples", "eval_samples"):
        assert keys.count(key) == 1, key


def test_checker_fails_a_log_without_init_stop(tiny_run, tmp_path):
    lines = (tiny_run / "events.log").read_text().splitlines()
    broken = tmp_path / "broken.log"
    broken.write_text("\n".join(line for line in lines if '"init_stop"' not in line) + "\n")
    result = check_log(broken)
    assert not result["ok"] and "init_stop" in result["output"]
    p = subprocess.run([sys.executable, "-m", "speechperf", "check-log", str(broken), "--json"],
                       capture_output=True, text=True, timeout=300)
    row = json.loads(p.stdout)[0]
    assert p.returncode == 1 and not row["compliant"] and "init_stop" in row["first_finding"]
    ok = subprocess.run([sys.executable, "-m", "speechperf", "check-log", str(tiny_run)],
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and "True" in ok.stdout


@pytest.mark.parametrize("to_group", [True, False], ids=["group", "process"])
def test_a_sigterm_stops_check_log_and_removes_its_rules_folder(tiny_run, tmp_path, to_group):
    """SIGTERM while mlperf-logging's checker runs: exit 143, said, its temporary rules folder gone."""
    import os

    from tests.conftest import cli_start, sigterm_when_ready

    p = cli_start("check-log", tiny_run, session=True, fresh=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    rc, err = sigterm_when_ready(p, lambda: bool(list(tmp_path.glob("speechperf-mlperf-*/*"))), to_group)
    assert rc == 143, err[-2000:]
    assert "speechperf: error: stopped by SIGTERM" in err and "Traceback" not in err
    assert not list(tmp_path.glob("speechperf-mlperf-*"))


def test_samples_counted_from_the_indexes(tiny_features, tiny_run):
    events = {e["key"]: e for e in read_events(tiny_run / "events.log")}
    train_utts = sum(len(json.loads((tiny_features / s / "index.json").read_text())["utterances"])
                     for s in events["train_samples"]["metadata"]["splits"])
    dev_utts = len(json.loads((tiny_features / "dev-clean" / "index.json").read_text())["utterances"])
    assert events["train_samples"]["value"] == train_utts > 0
    assert events["eval_samples"]["value"] == dev_utts > 0


def test_fixed_counts_log_the_configured_batch_and_the_index_loads_once(tiny_features, tmp_path, monkeypatch):
    """The training splits' index is read once per run (it was read again every epoch, inside
    the TTA clock: ~1.5 CPU s an epoch at LibriSpeech size), and fixed counts log batch_size."""
    from speechperf.data import index as index_mod

    loads = []
    real = index_mod.load
    monkeypatch.setattr(index_mod, "load", lambda feats, splits: loads.append(tuple(splits)) or real(feats, splits))
    _train(tiny_features, tmp_path / "run", TINY + ["max_epochs=3", "loader.balance=true"])
    train_loads = [s for s in loads if any(x.startswith("train") for x in s)]
    assert len(train_loads) == 1, loads  # three epochs and the schedule's planned steps: one load
    events = {e["key"]: e for e in read_events(tmp_path / "run" / "events.log")}
    assert events["global_batch_size"]["value"] == 4 and "batching" not in events["global_batch_size"]["metadata"]


def test_initialization_is_outside_the_tta_clock(tiny_features, tmp_path, monkeypatch):
    real = trainer.initialize

    def slow_initialize(*args, **kw):
        time.sleep(1.5)  # a cold numba cache, say
        return real(*args, **kw)

    monkeypatch.setattr(trainer, "initialize", slow_initialize)
    summary = _train(tiny_features, tmp_path / "run")
    assert summary["init_s"] >= 1.5
    stop = [e for e in read_events(tmp_path / "run" / "events.log") if e["key"] == "init_stop"][0]
    assert stop["metadata"]["init_s"] >= 1.5 and "decoder_s" in stop["metadata"]
    with ResultsDB(tmp_path / "run" / "results.db") as db:
        first = db.query("SELECT clock_s FROM iterations ORDER BY iteration LIMIT 1")[0]["clock_s"]
    assert first < 1.5  # the first step is timed from run_start, not from init_start


def test_resumed_run_log_still_complies(tiny_features, tmp_path, monkeypatch):
    real_step, calls = loop.train_step, {"n": 0}

    def dying_step(*args, **kw):
        calls["n"] += 1
        if calls["n"] == 5:  # after the checkpoint at iteration 3
            raise KeyboardInterrupt
        return real_step(*args, **kw)

    monkeypatch.setattr(loop, "train_step", dying_step)
    with pytest.raises(KeyboardInterrupt):
        _train(tiny_features, tmp_path / "run")
    monkeypatch.setattr(loop, "train_step", real_step)
    summary = loop.train(TrainRequest(resume=tmp_path / "run", quiet=True))
    assert summary["status"] == "success"
    events = read_events(tmp_path / "run" / "events.log")
    keys = [e["key"] for e in events]
    assert keys.count("init_start") == keys.count("init_stop") == keys.count("run_start") == 1
    assert keys.count("run_stop") == 1  # the aborted run_stop after the checkpoint was truncated away
    resume = [e for e in events if e["key"] == "resume"][0]
    assert resume["metadata"]["init_s"] > 0
    assert summary["init_s"] >= stop_init(events) + resume["metadata"]["init_s"] - 1e-3
    result = check_log(tmp_path / "run" / "events.log")
    assert result["ok"], result["output"]


def stop_init(events) -> float:
    return [e for e in events if e["key"] == "init_stop"][0]["metadata"]["init_s"]



@pytest.fixture(scope="module")
def wer_run(tiny_features, tmp_path_factory):
    """A one-epoch run whose target metric is WER (not the default)."""
    from speechperf.metric import DEFAULT_TARGET, WER

    assert WER.name != DEFAULT_TARGET
    run = tmp_path_factory.mktemp("wer") / "run"
    _train(tiny_features, run, ["max_epochs=1", "threads=1", f"train.stop.target_metric={WER.name}",
                                "train.eval.final_splits=none"])
    return run


def test_a_wer_target_run_logs_wer_as_eval_accuracy_and_complies(wer_run):
    """eval_accuracy states the run's train.stop.target_metric, named, with the other metrics beside it."""
    from speechperf.metric import CER, WER

    (line,) = [e for e in read_events(wer_run / "events.log") if e["key"] == "eval_accuracy"]
    with ResultsDB(wer_run / "results.db", readonly=True) as db:
        (row,) = db.query("SELECT * FROM evals WHERE final = 0")
    assert line["metadata"]["metric"] == WER.name and line["value"] == row[WER.name]
    assert line["metadata"][CER.name] == round(row[CER.name], 3)  # the other metrics: metadata
    assert WER.name not in line["metadata"]
    result = check_log(wer_run / "events.log")
    assert result["ok"], result["output"]


def test_the_checker_accepts_every_target_metric_and_refuses_another(wer_run, tmp_path):
    from speechperf.metric import WER, targets
    from speechperf.results.mlperf import benchmark_rules

    assert f" v['metadata']['metric'] in {list(targets())!r} " in benchmark_rules()
    text = (wer_run / "events.log").read_text()
    renamed = tmp_path / "renamed.log"
    renamed.write_text(text.replace(f'"metric": "{WER.name}"', '"metric": "loss"'))
    assert renamed.read_text() != text
    result = check_log(renamed)
    assert not result["ok"] and "eval_accuracy" in result["output"]
