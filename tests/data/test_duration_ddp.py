"""Duration batches under torchrun: two processes plan the epoch together, deal its batches
and run the same number of steps (a rank left without data would hang DDP's all-reduce)."""
import json

import pytest

from speechperf.config import load_preset
from speechperf.data.loader import load_index
from speechperf.data.plan import global_batch, plan_epoch
from speechperf.results.events import read_events
from speechperf.results.mlperf import check_log
from tests.conftest import torchrun, torchrun_args

SETTINGS = ["max_duration=12", "bucket_window=2"]


@pytest.mark.timeout(400)
def test_two_ranks_same_steps_with_duration_batches(tiny_features, tmp_path):
    run = tmp_path / "ddp"
    p = torchrun(*torchrun_args("train", "--data", tiny_features, "--out", run, "--preset", "tiny", "max_epochs=1",
                                "threads=1", "device=cpu", *SETTINGS), timeout=380)
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads((run / "summary.json").read_text())
    cfg = load_preset("tiny", SETTINGS)
    index = load_index(tiny_features, ["train-clean", "train-other"])
    whole = plan_epoch(index, cfg.loader, 1, cfg.train.seed)
    assert len(whole) >= 4  # the fixture's corpus gives several batches of 12 s
    assert summary["status"] == "success" and summary["iterations"] == len(whole) // 2
    # MLPerf's global_batch_size: what a step of both ranks took on average (the batch_size is unused)
    logged = {e["key"]: e for e in read_events(run / "events.log")}["global_batch_size"]
    mean = global_batch(index, cfg.loader, cfg.train.seed, 2)
    shuffled = plan_epoch(index, cfg.loader, 2, cfg.train.seed)
    assert mean == sum(len(b) for b in shuffled.batches[: len(shuffled) // 2 * 2]) / (len(shuffled) // 2)
    assert logged["value"] == round(mean) != cfg.loader.batch_size
    assert logged["metadata"]["batching"] == "duration" and logged["metadata"]["max_duration_s"] == 12
    assert check_log(run / "events.log")["ok"]
