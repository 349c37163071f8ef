"""Seeds aggregated per group and groups compared, on runs of known TTAs (no training)."""
import math

import pytest

from speechperf.studies.aggregate import SeedRun, aggregate, groups_of

EPOCH_S = {"fast": 60.0, "slow": 120.0}  # TTA clock per epoch on each machine


def run(machine: str, seed: int, reach: int | None, status="max_epochs", lr=0.001, epochs=12) -> SeedRun:
    """A run whose CER drops below 10 for good at epoch ``reach`` (None: never), 3-epoch median rule:
    TTA = (reach + 1) epochs (two of the last three at 9; at least 3) x the machine's minutes per epoch."""
    cers = [9.0 if reach is not None and e >= reach else 20.0 for e in range(1, epochs + 1)]
    evals = tuple((e * EPOCH_S[machine], c) for e, c in enumerate(cers, 1))
    config = {"preset": "cpu", "model": {"name": "ds2"}, "train": {"seed": seed, "optim": {"lr": lr}}}
    return SeedRun(f"{machine} s{seed}", "ds2, 1 M params", f"2-core {machine}", config, status, evals)


def rows(runs, targets=(10.0,)):
    return aggregate(runs, lambda r: targets, "cer", 3)


def test_groups_are_workload_config_apart_from_seed_and_machine():
    runs = [run("fast", 1, 3), run("fast", 2, 4), run("slow", 1, 3), run("fast", 3, 3, lr=0.002)]
    assert [len(g) for g in groups_of(runs).values()] == [2, 1, 1]


def test_group_statistics_by_hand():
    # epochs to target 5, 6, 7, 9, 12 -> TTA (1 min per epoch) 5, 6, 7, 9, 12 minutes
    runs = [run("fast", s, reach) for s, reach in zip((1, 2, 3, 4, 5), (4, 5, 6, 8, 11))]
    per_run, (g,), comparisons = rows(runs)
    assert (g["runs"], g["reached"], g["never reached"], g["unfinished"]) == (5, 5, 0, 0)
    assert g["median TTA min"] == 7.0
    assert g["olympic TTA min"] == pytest.approx((6 + 7 + 9) / 3)  # drop the fastest (5) and the slowest (12)
    assert (g["min TTA min"], g["max TTA min"]) == (5.0, 12.0)
    assert g["epochs to target per seed"] == "s1:5 s2:6 s3:7 s4:9 s5:12"
    assert (g["median epochs to target"], g["median min/epoch"]) == (7, 1.0)
    assert [(r["epochs to target"], r["min/epoch"], r["minutes"]) for r in per_run][:2] == [(5, 1.0, 5.0), (6, 1.0, 6.0)]
    assert comparisons == []


def test_a_seed_that_never_reaches_is_a_failed_run_never_dropped():
    runs = [run("fast", 1, 3), run("fast", 2, 4), run("fast", 3, None), run("fast", 4, None, status="running")]
    _, (g,), _ = rows(runs)
    assert (g["reached"], g["never reached"], g["unfinished"]) == (2, 1, 1)
    assert g["median TTA min"] == 5.0  # of 4, 5 and "never" (slower than any): 5
    assert g["olympic TTA min"] == 5.0 and "failed run is the slowest" in g["olympic rule"]  # drop 4; the failure is dropped
    assert g["epochs to target per seed"] == "s1:4 s2:5 s3:never s4:unfinished"
    _, (two,), _ = rows(runs[:2] + [run("fast", 3, None), run("fast", 5, None)])
    assert two["olympic TTA min"] is None and "2 runs never reached" in two["olympic rule"]


def test_machines_not_distinguishable_when_the_interval_holds_one():
    fast = [run("fast", s, r) for s, r in zip(range(1, 6), (3, 6, 9, 4, 8))]  # TTA 4, 7, 10, 5, 9 (1 min/epoch)
    slow = [run("slow", s, r) for s, r in zip(range(1, 6), (2, 3, 1, 4, 2))]  # TTA 6, 8, 6, 10, 6 (2 min/epoch)
    _, groups, (c,) = rows(fast + slow)
    assert c["95% low"] < 1 < c["95% high"]
    assert c["verdict"] == "not distinguishable at 5 and 5 seeds"
    assert c["min/epoch ratio A/B"] == 0.5  # the hardware is twice as fast; the seeds hide it


def test_a_clear_winner_is_ranked_and_its_factor_named():
    fast = [run("fast", s, 3) for s in range(1, 6)]  # TTA 4 min every seed
    slow = [run("slow", s, 3) for s in range(1, 6)]  # 8 min
    _, _, (c,) = rows(fast + slow)
    assert (c["TTA ratio A/B"], c["95% low"], c["95% high"]) == (0.5, 0.5, 0.5)
    assert c["verdict"] == "2-core fast cpu 2x faster than 2-core slow cpu; mostly faster epochs (hardware)"


def test_single_runs_are_never_ranked():
    _, _, (c,) = rows([run("fast", 1, 3), run("slow", 1, 8)])
    assert c["verdict"].startswith("not distinguishable at 1 and 1 seeds") and math.isinf(c["95% high"])


def test_a_group_whose_machine_changed_speed_between_seeds_is_flagged():
    from dataclasses import replace

    from speechperf.studies.aggregate import speed_notes

    steady = [run("fast", s, 3) for s in (1, 2, 3)]  # 1.0 min per epoch each
    _, (g,), _ = rows(steady)
    assert g["min/epoch max/min"] == 1.0 and speed_notes([g]) == []
    slowed = replace(steady[2], evals=tuple((t * 1.25, c) for t, c in steady[2].evals))  # same machine, 1.25 min/epoch
    _, (g,), _ = rows(steady[:2] + [slowed])
    assert g["min/epoch max/min"] == pytest.approx(1.25)
    (line,) = speed_notes([g, {**g, "target": 8.0, "min/epoch max/min": 1.2}])  # one line a group, its worst target
    assert "varied 1.25x" in line and line.startswith(g["group"])
    _, (one,), _ = rows(steady[:1])
    assert one["min/epoch max/min"] is None and speed_notes([one]) == []


def test_under_three_runs_no_score_as_the_summarizer_says_without_asking_it():
    """The early answer for fewer than MIN_RUNS runs (no pandas import in a one-run ``tta``)
    is the result summarizer's own."""
    from speechperf.scoring.olympic import MAX_DROPPED, MIN_RUNS, _olympic, olympic_mean
    for reached, failed in (([], 0), ([5.0], 0), ([5.0, 6.0], 0), ([5.0], 1)):
        assert len(reached) + failed < MIN_RUNS
        assert _olympic()(sorted(reached), failed, MAX_DROPPED) is None
        score, why = olympic_mean(reached, failed)
        assert score is None and f"needs {MIN_RUNS}" in why
    assert _olympic()([5.0, 6.0, 7.0], 0, MAX_DROPPED) == olympic_mean([5.0, 6.0, 7.0], 0)[0] == 6.0


def _in(precision: str, r: SeedRun) -> SeedRun:
    from dataclasses import replace

    return replace(r, config={**r.config, "train": {**r.config["train"], "system": {"precision": precision}}})


def test_machines_each_at_their_best_say_so_beside_the_ratio():
    fast = [_in("bf16", run("fast", s, 3)) for s in range(1, 6)]
    slow = [_in("fp32", run("slow", s, 3)) for s in range(1, 6)]
    _, groups, (c,) = rows(fast + slow)
    assert [g["precision"] for g in groups] == ["bf16", "fp32"]
    assert (c["precision A"], c["precision B"]) == ("bf16", "fp32")
    assert c["precisions"] == "each at its best (bf16, fp32): not a like-for-like precision comparison"
    assert c["verdict"].startswith("2-core fast cpu 2x faster than 2-core slow cpu") and c["verdict"].endswith(
        "; each at its best (bf16, fp32): not a like-for-like precision comparison")
    _, _, (same,) = rows([_in("bf16", r) for r in fast + slow])  # one precision: nothing extra
    assert same["precisions"] is None and "each at its best" not in same["verdict"]
    _, _, (old,) = rows([run("fast", 1, 3), run("slow", 1, 3)])  # recorded without a precision: fp32
    assert (old["precision A"], old["precisions"]) == ("fp32", None)
