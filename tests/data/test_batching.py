"""A run's batching, described once: the plan, the schedule's steps, MLPerf's batch, the batch the
splits must hold and the by-count batches are data/plan.py's, read through one object; nothing
else in the package reads ``max_duration``."""
import ast
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import speechperf
from speechperf.data.batching import Batching
from speechperf.data.index import librispeech_like
from speechperf.data.loader_config import LoaderConfig
from speechperf.data.plan import global_batch, plan_epoch, steps_per_epoch

COUNT = LoaderConfig(batch_size=24, bucket_window=4)
DURATION = replace(COUNT, max_duration=120.0)


@pytest.fixture(scope="module")
def index():
    return librispeech_like(0, splits=(700,))  # 11 shards of 64


@pytest.mark.parametrize("loader", [COUNT, replace(COUNT, balance=True), DURATION])
@pytest.mark.parametrize("world", [1, 3])
def test_the_plans_and_steps_are_data_plan_s_bit_for_bit(index, loader, world):
    b = Batching(loader, seed=7, world=world)
    for epoch in (1, 2):
        for rank in range(world):
            mine, theirs = b.plan(index, epoch, rank), plan_epoch(index, loader, epoch, 7, rank, world)
            assert len(mine) == len(theirs) > 0
            assert all(np.array_equal(x, y) for x, y in zip(mine.batches, theirs.batches))
            assert np.array_equal(mine.groups, theirs.groups)
    assert b.steps_per_epoch(index) == steps_per_epoch(index, loader, 7, world)
    assert b.steps_per_epoch(index, utterances=100) == steps_per_epoch(index, loader, 7, world, 100)


def test_mlperf_s_batch_is_the_configured_count_or_the_rounded_mean_of_duration_batches(index):
    assert Batching(COUNT, 7, 2).mlperf_batch(index) == (24, {})
    value, meta = Batching(DURATION, 7, 2).mlperf_batch(index)
    mean = global_batch(index, DURATION, 7, 2)
    assert value == max(1, round(mean)) and value != 24
    assert meta == {"batching": "duration", "mean_utterances": round(mean, 3), "max_duration_s": 120.0}


def test_the_splits_must_hold_a_configured_batch_only(index):
    assert Batching(COUNT).checked_batch == 24 and Batching(DURATION).checked_batch is None
    assert (Batching(COUNT).method, Batching(DURATION).method) == ("full", "duration")


def test_by_count_turns_duration_batches_into_the_configured_count(index):
    counted = Batching(DURATION, 7, 2).by_count()
    assert counted == Batching(COUNT, 7, 2) and counted.method == "full"
    assert Batching(COUNT).by_count() == Batching(COUNT)


def test_evaluation_cuts_evaluation_sized_batches_in_order(index):
    sized = Batching(replace(DURATION, eval_max_duration=480.0, shuffle=True, readers=2), 7, 3)
    cfg = sized.for_eval(index)
    assert (cfg.max_duration, cfg.shuffle, cfg.mode, cfg.sort_first_epoch) == (480.0, False, "bucket", False)
    assert Batching(DURATION).for_eval(index).max_duration == 120.0  # 0: the training batches' size


def _reads(path: Path) -> list[int]:
    tree = ast.parse(path.read_text())
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "max_duration"]


def test_only_the_batching_and_the_plan_read_max_duration():
    """The batching is described once: every other module asks data/batching.py."""
    root = Path(speechperf.__file__).parent
    owners = {"data/batching.py", "data/plan.py", "data/loader_config.py"}  # the cut, its object, its field
    readers = {str(p.relative_to(root)): _reads(p) for p in root.rglob("*.py")}
    assert {name for name, lines in readers.items() if lines} - owners == set()
