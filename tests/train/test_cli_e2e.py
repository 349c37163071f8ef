"""End to end through the real CLI: synth -> prepare -> train -> tta, on a tiny corpus."""
import json
from functools import partial

from speechperf import metric
from speechperf.results import ResultsDB
from speechperf.results.events import read_events
from tests.conftest import cli as run_cli

# each command's first call: a fresh interpreter, as a user's shell starts it (not forked from the
# suite's preloaded server), where an import error or circle the server would hide shows; its
# repeats (``again``) fork from the server, the same code without paying the start-up (2-3 s of CPU
# each) again. A command that fails fails the test, unless check=False
cli = partial(run_cli, timeout=600, check=True, fresh=True)
again = partial(run_cli, timeout=600, check=True)


def test_cli_end_to_end(tmp_path):
    corpus, feats, run = tmp_path / "corpus", tmp_path / "feats", tmp_path / "run"
    rows = json.loads(cli("corpus", "synth", corpus, "--hours", "0.01", "--seed", "5", "--json").stdout)
    assert {r["split"] for r in rows} >= {"train-clean", "dev-clean"}
    cli("prepare", corpus, feats, "--workers", "1", "--json")
    cli("train", "--preset", "tiny", "--data", feats, "--out", run, "max_epochs=2", "threads=1", "--json")

    for name in ("run.json", "config.json", "env.json", "events.log", "sentences.jsonl", "checkpoint.pt", "summary.json"):
        assert (run / name).exists(), name
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "success" and summary["epochs"] == 2
    # checked against the shipped tiny reference at its target, which measured another recipe (10 epochs)
    (check,) = summary["convergence"]["checks"]
    assert summary["convergence"]["reference"] == "tiny.json" and check["RCP check"].startswith(
        "reference is for another recipe: train.stop.max_epochs=2 (reference 10)")

    keys = [e["key"] for e in read_events(run / "events.log")]
    assert keys.count("run_start") == 1 and keys.count("run_stop") == 1
    assert keys.count("eval_accuracy") == 2 and keys.count("epoch_start") == 2
    stop = [e for e in read_events(run / "events.log") if e["key"] == "run_stop"][0]
    assert stop["metadata"]["status"] == "success"

    info = json.loads((run / "run.json").read_text())
    assert info["format"] == 2 and info["label"].endswith(" tiny fp32")
    with ResultsDB(run / "results.db", readonly=True) as db:
        its = db.query("SELECT * FROM iterations WHERE run_id = ? ORDER BY iteration", [info["run_id"]])
        evals = db.query("SELECT * FROM evals WHERE run_id = ? AND final = 0 ORDER BY epoch", [info["run_id"]])
        finals = db.query("SELECT split FROM evals WHERE run_id = ? AND final = 1", [info["run_id"]])
    assert len(its) == summary["iterations"] > 0
    assert all(r["utts_per_s"] > 0 and r["batch_size"] > 0 for r in its)
    assert [r["clock_s"] for r in its] == sorted(r["clock_s"] for r in its)
    assert len(evals) == 2 and all(0 <= r["cer"] for r in evals)
    assert {"dev-clean", "test-clean"} <= {r["split"] for r in finals}

    # 100 %: the highest target there is (CER passes 100 % only through insertions); 0.001: never reached
    table = json.loads(cli("tta", run, "--metric", "cer", "--targets", "100,0.001", "--epochs", "1",
                           "--price-per-hour", "6", "--json").stdout)["runs"]
    reached = next((e["clock_s"] / 60 for e in evals if e["cer"] <= 100), None)
    assert all(set(r) >= {"run", "machine", "metric", "target", "median of", "epochs to target", "minutes", "relative", "init s", "platform",
                          "cost to accuracy $", "price note"} for r in table)
    assert table[0]["run"] == info["label"] and table[0]["init s"] > 0
    assert table[0]["cost to accuracy $"] == (None if reached is None else table[0]["minutes"] / 60 * 6)
    assert table[0]["minutes"] == reached and table[0]["relative"] == (None if reached is None else 100.0)
    assert table[1]["minutes"] is None and table[1]["relative"] is None  # never reached: NA
    text = again("tta", run, "--targets", "0.001", "--wide").stdout  # every column as text, without a price: a CPU box has none
    assert "NA" in text and "give --price-per-hour" in text
    assert "none: unreached" in again("tta", run, "--targets", "0.001").stdout  # the narrow table: one word why

    row = json.loads(cli("eval", run, "--decoder", "wordbeam", "--beam", "4", "--mode", "ngrams_forecast",
                         "--json").stdout)
    assert row[0]["decoder"] == "wordbeam:ngrams_forecast" and row[0]["n_utts"] > 0 and 0 <= row[0]["cer"]
    sweep = json.loads(cli("beam-sweep", run, "--widths", "1,4", "--json").stdout)
    assert [r["beam"] for r in sweep] == [1, 4] and all(r["eval_s"] > 0 and r["decoder"] == "wordbeam" for r in sweep)
    assert all(r[c] is not None for r in sweep for c in metric.columns())  # every declared metric: SER too
    with ResultsDB(run / "results.db", readonly=True) as db:
        assert len(db.query("SELECT * FROM beam_sweep WHERE run_id = ?", [info["run_id"]])) == 2
    bad_mode = again("eval", run, "--mode", "fastest", check=False)
    assert bad_mode.returncode == 2 and "fastest" in bad_mode.stderr

    other = again("train", "--preset", "tiny", "--data", feats, "--out", run, check=False)
    assert other.returncode == 2 and "holds a run of another configuration (train.system.threads: 1 there, 0 now)" in other.stderr
    events_before = (run / "events.log").read_bytes()
    done = again("train", "--preset", "tiny", "--data", feats, "--out", run, "max_epochs=2", "threads=1", "--json")
    assert json.loads(done.stdout) == [summary]  # finished: reported, nothing changed
    assert (run / "events.log").read_bytes() == events_before
    refused = again("train", "--preset", "tiny", "--data", feats, "--out", run, "max_epochs=2", "threads=1",
                  "--resume", "no", check=False)
    assert refused.returncode == 2 and "already holds a run" in refused.stderr
    bad = again("train", "--preset", "tiny", "--data", tmp_path / "nowhere", "--out", tmp_path / "r2", check=False)
    assert bad.returncode == 2 and "nowhere" in bad.stderr
