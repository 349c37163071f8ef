"""Reading the device every N steps changes when the loop learns its losses, not what it
computes or records."""
import json

import torch

from speechperf.results import ResultsDB
from speechperf.results.checkpoint import load as load_checkpoint
from speechperf.train.loop import TrainRequest, train


def _run(feats, out, *over):
    summary = train(TrainRequest("tiny", feats, out, ["max_epochs=1", "threads=1", "device=cpu", "checkpoint_every=6",
                                                      "sentence_every=4", *over], quiet=True))
    info = json.loads((out / "run.json").read_text())
    with ResultsDB(out / "results.db") as db:
        rows = db.query("SELECT iteration, loss, batch_size FROM iterations WHERE run_id = ? ORDER BY iteration",
                        [info["run_id"]])
    return summary, rows, load_checkpoint(out)


def test_sync_every_n_records_the_same_run_as_every_step(tiny_features, tmp_path):
    s1, rows1, c1 = _run(tiny_features, tmp_path / "one")
    s7, rows7, c7 = _run(tiny_features, tmp_path / "seven", "sync_every=7")
    assert s7["iterations"] == s1["iterations"] == len(rows7) > 7
    assert [(r["iteration"], r["loss"], r["batch_size"]) for r in rows7] == \
        [(r["iteration"], r["loss"], r["batch_size"]) for r in rows1]
    assert (s7["skipped_steps"], s7["impossible_utts"]) == (s1["skipped_steps"], s1["impossible_utts"])
    for k, v in c1["model"].items():
        assert torch.equal(v, c7["model"][k]), k
    sentences = [json.loads(line) for line in (tmp_path / "seven" / "sentences.jsonl").read_text().splitlines()]
    assert [s["iteration"] for s in sentences] == list(range(4, s1["iterations"] + 1, 4))
    assert [s["loss"] for s in sentences] == [rows1[s["iteration"] - 1]["loss"] for s in sentences]
