"""The run's step against its floor (train/floor.py): which rows it replays, what it compares, and
that the run's model, optimizer, scaler and RNG are as before it."""
from dataclasses import replace
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from speechperf.config import load_preset
from speechperf.models import build_model
from speechperf.results.checkpoint import TrainState
from speechperf.studies.time_parts import FLOOR_OFF, floor_short, step_vs_floor
from speechperf.train import floor, loop
from speechperf.train.step import StepMeter, make_optimizer, read_point, train_step

CPU = torch.device("cpu")


def _rows(epochs: dict[int, int], start: int = 1) -> list[dict]:
    """Rows of consecutive iterations: ``{epoch: steps}``."""
    rows, it = [], start
    for epoch, n in epochs.items():
        for _ in range(n):
            rows.append({"iteration": it, "epoch": epoch, "batch_size": 2, "frames": 70, "step_s": 0.5,
                         "data_s": 0.1, "ckpt_s": 0.0})
            it += 1
    return rows


def _its(windows) -> list[list[int]]:
    return [[r["iteration"] for r in w] for w in windows]


def test_a_window_ends_where_a_lead_and_its_steps_lie_in_one_epoch_after_its_first_row():
    rows = _rows({1: 4, 2: 4})  # iterations 1-4, 5-8
    assert [rows[i]["iteration"] for i in floor.candidates(rows, 1)] == [2, 3, 4, 6, 7, 8]  # never an epoch's first
    rows = _rows({1: 5, 2: 5})  # 1-5, 6-10: windows of 2 end at a read point (a multiple of 2) with two rows before
    assert [rows[i]["iteration"] for i in floor.candidates(rows, 2)] == [4, 8, 10]
    gap = [r for r in _rows({1: 3, 2: 8}) if r["iteration"] != 6]  # epoch 2 (4-11) lost a row
    assert [gap[i]["iteration"] for i in floor.candidates(gap, 1)] == [2, 3, 5, 8, 9, 10, 11]


def test_windows_are_spread_over_every_epoch():
    rows = _rows({1: 10, 2: 10, 3: 10})  # 27 candidates: all but iterations 1, 11, 21
    got = floor.pick_windows(rows, 6, 1)
    # the candidates at (k + 0.5) x 27 / 6: places 2, 6, 11, 15, 20, 24
    assert _its(got) == [[3, 4], [7, 8], [13, 14], [17, 18], [23, 24], [27, 28]]
    assert _its(floor.pick_windows(rows, 1, 1)) == [[15, 16]]  # one window: the run's middle
    assert len(floor.pick_windows(_rows({1: 3}), 5, 1)) == 2  # no more windows than candidates
    assert floor.pick_windows(_rows({1: 1, 2: 1}), 3, 1) == []  # no epoch with two rows


def test_the_budget_caps_the_windows():
    rows = [{**r, "clock_s": 100.0 * r["iteration"] / 10} for r in _rows({1: 10})]  # 100 s, steps of 0.4 s
    assert floor.affordable(rows, 1) == 6  # 10% of 100 s over 2 passes x 2 steps x 0.4 s = 6.25
    assert floor.affordable(rows, 25) == 1  # at least one window
    assert floor.affordable(_rows({1: 3}), 1) is None  # no clock in the rows: the steps asked


def test_loop_over_floor_is_the_median_with_its_spread_and_names_the_outliers():
    units = [{"iteration": it, "last": it, "loop_s": 1.0, "floor_s": f, "flops": 2e9, "ratio": 1.0 / f}
             for it, f in [(10, 1.0), (20, 1 / 1.1), (30, 1 / 1.2), (40, 1.0), (50, 1 / 3.0)]]
    got = floor.compare(units, run_flops_s=2e9 / 1.1)  # the run's median step: 1.1 s for 2 GFLOP
    assert got["loop_over_floor"] == pytest.approx(1.1)
    assert got["loop_over_floor_p10"] == pytest.approx(1.0)  # sorted 1.0 1.0 1.1 1.2 3.0: 10% at 0.4 of a place
    assert got["loop_over_floor_p90"] == pytest.approx(1.2 + 0.6 * 1.8)  # 90% at 3.6 places
    assert got["outliers"] == [{"iteration": 50, "last": 50, "ratio": pytest.approx(3.0)}] and got["outlier_count"] == 1
    # the floor's rates: 2 GFLOP over 1, 1/1.1, 1/1.2, 1, 1/3 s: median 2.2 GFLOP/s; the run's median step 1.1 s
    assert got["floor_tflops"] == pytest.approx(2.2e-3) and got["loop_tflops"] == pytest.approx(2e9 / 1.1 / 1e12)
    assert got["run_over_floor"] == pytest.approx(2.2 * 1.1 / 2)
    no_flops = floor.compare([{**u, "flops": None} for u in units], None)
    assert no_flops["run_over_floor"] is None and no_flops["floor_tflops"] is None
    assert floor.compare([{**units[0], "ratio": None}], None)["loop_over_floor"] is None


def test_the_demo_that_shared_its_machine_names_its_slow_steps_and_its_median_stays():
    """Ten steps at 0.93 s and two at 2.7 and 1.7 s (the demo's epoch 2) against a floor of 0.9 s a step."""
    rows = [{"iteration": 79 + i, "epoch": 2, "batch_size": 24, "frames": 9000, "step_s": s, "data_s": 0.0,
             "ckpt_s": 0.0, "model_flops": 1e11} for i, s in enumerate([0.93, 0.93, 2.7, 1.7, *[0.93] * 8])]
    units = [floor.unit([a, b], [0.9, 0.9]) for a, b in zip(rows, rows[1:])]
    got = floor.compare(units, floor.run_rate(rows))
    assert got["loop_over_floor"] == pytest.approx(0.93 / 0.9)
    assert [(u["iteration"], round(u["ratio"], 2)) for u in got["outliers"]] == [(81, 3.0), (82, 1.89)]
    assert got["run_over_floor"] == pytest.approx(0.93 / 0.9)  # the run's median row beside the sampled one
    assert floor.run_rate(rows) == pytest.approx(1e11 / 0.93)  # the epoch's first row (79) left out


def test_a_window_compares_its_timed_rows_not_its_lead():
    rows = [{"iteration": 4 + i, "epoch": 1, "step_s": s, "data_s": 0.1, "ckpt_s": 0.0, "model_flops": f}
            for i, (s, f) in enumerate([(9.0, 1e9), (0.6, 2e9), (0.7, 3e9)])]
    got = floor.unit(rows, [5.0, 0.25, 0.25])
    assert (got["iteration"], got["last"], got["epoch"]) == (5, 6, 1)
    assert got["loop_s"] == pytest.approx(1.1) and got["floor_s"] == pytest.approx(0.5)
    assert got["flops"] == 5e9 and got["ratio"] == pytest.approx(2.2)


def test_a_rows_loop_seconds_leave_out_data_and_checkpoints():
    assert floor.loop_seconds({"step_s": 0.5, "data_s": 0.1, "ckpt_s": 0.15}) == pytest.approx(0.25)
    assert floor.loop_seconds({"step_s": 0.5, "data_s": None, "ckpt_s": None}) == 0.5  # an older row


def _batch(frames, seed):
    g = torch.Generator().manual_seed(seed)
    return SimpleNamespace(feats=torch.randn(len(frames), max(frames), 93, generator=g),
                           feat_lens=torch.tensor(frames), labels=torch.randint(2, 28, (4 * len(frames),), generator=g),
                           label_lens=torch.tensor([4] * len(frames)), ids=[f"u{seed}-{i}" for i in range(len(frames))])


class _Loader(list):
    closed = False

    def close(self):
        self.closed = True


def _trainer(steps: int, batches: list, *over):
    cfg = load_preset("tiny", [f"train.floor.steps={steps}", *over])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    optimizer = make_optimizer(model, cfg.train, CPU)
    state = TrainState(model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0),
                       torch.amp.GradScaler("cuda", enabled=False))
    loaders, asked = [], []

    def epoch_loader(epoch, start=0, readers=None):  # every epoch the same batches (a dict: its own per epoch)
        assert readers == 0  # the floor's few batches are read in this process
        asked.append((epoch, start))
        loaders.append(_Loader((batches[epoch] if isinstance(batches, dict) else batches)[start:]))
        return loaders[-1]
    return SimpleNamespace(cfg=cfg, state=state, model=model, group=SimpleNamespace(device=CPU, world=1),
                           epoch_loader=epoch_loader, loaders=loaders, asked=asked)


BATCHES = [_batch((40, 30), 1), _batch((50, 20), 2), _batch((35, 35), 3), _batch((30, 25), 4)]


def _rows_of(batches, first: int, epoch: int = 2) -> list[dict]:
    return [{"iteration": first + i, "epoch": epoch, "batch_size": len(b.feat_lens), "frames": int(b.feat_lens.sum()),
             "step_s": 0.2 + 0.01 * i, "data_s": 0.05, "ckpt_s": 0.01 * (i == 2)} for i, b in enumerate(batches)]


def _fixed_replay(monkeypatch, seconds: float = 0.1) -> list[int]:
    """replay() replaced by one whose timed steps take ``seconds`` each: the windows' first iterations, per call."""
    calls = []

    def fake(batches, first_iteration, model, state, device, cfg):
        calls.append(first_iteration)
        return [1.0] + [seconds] * (len(batches) - 1)
    monkeypatch.setattr(floor, "replay", fake)
    return calls


TWO_EPOCHS = _rows_of(BATCHES, 1, epoch=1) + _rows_of(BATCHES, 5, epoch=2)  # iterations 1-4 and 5-8


def test_the_floor_sets_the_sampled_iterations_rows_against_their_replay(monkeypatch):
    calls = _fixed_replay(monkeypatch)
    t = _trainer(3, BATCHES)
    got = floor.measure(t, TWO_EPOCHS)
    # candidates 2 3 4 6 7 8: windows ending at places 1, 3, 5 (lead, step): 2-3, 5-6, 7-8, by loaders at their batch
    assert t.asked == [(1, 1), (2, 2), (2, 0)] and all(x.closed for x in t.loaders)  # in spread order
    assert calls == [2, 7, 5, 2, 7, 5]  # two passes, the second timed, in spread order (first, last, middle)
    timed = [r for r in TWO_EPOCHS if r["iteration"] in (3, 6, 8)]
    ratios = sorted(floor.loop_seconds(r) / 0.1 for r in timed)
    assert (got["steps"], got["asked"], got["span"], got["windows"], got["epochs"]) == (3, 3, 1, 3, 2)
    assert (got["first_iteration"], got["last_iteration"], got["note"]) == (3, 8, None)
    assert got["loop_s"] == pytest.approx(sum(floor.loop_seconds(r) for r in timed) / 3)
    assert got["floor_s"] == pytest.approx(0.1) and got["loop_over_floor"] == pytest.approx(ratios[1])
    assert got["loop_over_floor_p10"] == pytest.approx(ratios[0] + 0.2 * (ratios[1] - ratios[0]))
    assert got["outliers"] == [] and got["utterances"] == 2 and got["replay_s"] > 0
    assert got["run_over_floor"] is None  # the rows hold no FLOPs
    assert 0 <= got["replay_others_pct"] <= 100 and isinstance(got["replay_shared"], bool)  # the replay's neighbours


def test_a_replayed_batch_unlike_its_row_is_not_compared(monkeypatch):
    _fixed_replay(monkeypatch)
    rows = [dict(r) for r in TWO_EPOCHS]
    rows[5]["frames"] += 1  # iteration 6
    got = floor.measure(_trainer(3, BATCHES), rows)
    assert got["note"] == "not compared: epoch 2's replayed batch of iteration 6 is not the one its row recorded"
    assert "loop_over_floor" not in got
    short = floor.measure(_trainer(3, {1: BATCHES, 2: BATCHES[:3]}), TWO_EPOCHS)  # the plan gave fewer batches
    assert "iteration 8 is not the one" in short["note"]
    none = floor.measure(_trainer(3, BATCHES), _rows({1: 1, 2: 1}))
    assert none["note"] == "not measured: no epoch trained 2 steps in a row (a lead and 1 timed; train.floor.steps=3)"


def test_the_sync_period_makes_the_windows_and_the_budget_their_number(monkeypatch):
    calls = _fixed_replay(monkeypatch)
    rows = [{**r, "iteration": r["iteration"] + 2} for r in TWO_EPOCHS]  # 3-6, 7-10: windows of 2 end at 6, 10
    got = floor.measure(_trainer(4, BATCHES, "train.system.sync_every=2"), rows)
    assert calls == [4, 8, 4, 8] and (got["span"], got["windows"], got["steps"]) == (2, 2, 4)
    clocked = [{**r, "clock_s": 4.0} for r in TWO_EPOCHS]  # 4 s of clock: 5% is one window of 2 steps of ~0.2 s
    got = floor.measure(_trainer(3, BATCHES), clocked)
    assert (got["windows"], got["steps"], got["asked"]) == (1, 1, 3)
    assert "1 of 3 asked: the replay's budget" in step_vs_floor({"floor": got})


def test_a_window_times_floor_window_steps_in_whole_read_periods():
    def span(*over):
        return floor.window_span(load_preset("tiny", ["train.floor.steps=48", *over]).train)
    assert span() == 1 and span("train.floor.window=4") == 4  # 0: one period of sync_every (1 on a CPU)
    assert span("train.floor.window=5", "train.system.sync_every=2") == 6 and span("train.system.sync_every=25") == 25
    assert floor.window_span(load_preset("tiny", ["train.floor.steps=3", "train.floor.window=4"]).train) == 3
    t = load_preset("tiny").train
    assert "train.floor.window=-1 must be >= 0" in " ".join(replace(t, floor=replace(t.floor, window=-1)).problems())


def test_windows_of_several_steps_are_compared_whole_and_each_recorded(monkeypatch):
    calls = _fixed_replay(monkeypatch)
    rows = _rows_of(BATCHES * 3, 1, epoch=1)  # iterations 1-12 of one epoch
    got = floor.measure(_trainer(8, BATCHES * 3, "train.floor.window=4"), rows)
    # candidates end at 8 and 12 (a lead and 4 steps after the epoch's first): two windows, 3-8 and 7-12
    assert (got["span"], got["windows"], got["steps"], got["first_iteration"]) == (4, 2, 8, 5)
    assert calls == [4, 8, 4, 8]
    loop_s = [sum(floor.loop_seconds(r) for r in rows[i:i + 4]) for i in (4, 8)]
    assert got["window_s"] == [[5, round(loop_s[0], 5), 0.4], [9, round(loop_s[1], 5), 0.4]]


def test_a_smaller_budget_keeps_a_prefix_of_the_same_windows(monkeypatch):
    """The windows are picked from those asked, then the budget keeps the first few in spread order:
    a rerun that affords one window fewer compares the same windows but one."""
    calls = _fixed_replay(monkeypatch)
    rows = _rows_of(BATCHES * 5, 1, epoch=1)  # 20 steps of 0.2-0.39 s (less 0.05 s of data)
    wide = floor.measure(_trainer(6, BATCHES * 5), [{**r, "clock_s": 100.0} for r in rows])
    narrow = floor.measure(_trainer(6, BATCHES * 5), [{**r, "clock_s": 3.0} for r in rows])
    assert (wide["windows"], narrow["windows"]) == (6, 1) and calls[-1] == calls[0]
    first = {w[0] for w in narrow["window_s"]}
    assert first <= {w[0] for w in wide["window_s"]} and len(first) == 1


def test_the_run_is_as_before_the_replay():
    t = _trainer(3, BATCHES, "train.optim.name=adamw")
    before = {k: v.clone() for k, v in t.state.model.state_dict().items()}
    optimizer = t.state.optimizer  # a state to put back: one step trained before it
    train_step(t.model, BATCHES[0], optimizer, t.state.scaler, CPU, t.cfg.train)
    t.model.eval()
    after_step = {k: v.clone() for k, v in t.state.model.state_dict().items()}
    moments = [s["exp_avg"].clone() for s in optimizer.state.values()]
    rng, np_rng = torch.get_rng_state(), np.random.get_state()[1].copy()
    got = floor.measure(t, _rows_of(BATCHES, 7))
    assert got["note"] is None and got["loop_over_floor"] > 0 and got["windows"] == 3  # a real replay, 3 windows
    assert all(torch.equal(v, after_step[k]) for k, v in t.state.model.state_dict().items())
    assert any(not torch.equal(after_step[k], before[k]) for k in before)  # the test's own step moved them
    assert all(torch.equal(s["exp_avg"], m) for s, m in zip(optimizer.state.values(), moments))
    assert torch.equal(torch.get_rng_state(), rng) and not t.model.training  # SpecAugment's draws, eval mode kept
    assert np.array_equal(np.random.get_state()[1], np_rng)


def test_the_replay_reads_where_the_loop_reads(monkeypatch):
    t = _trainer(3, BATCHES, "train.system.sync_every=2", "train.eval.sentence_every=50", "train.system.checkpoint_every=50")
    reads = []
    real = StepMeter.read
    monkeypatch.setattr(StepMeter, "read", lambda self: reads.append([p.iteration for p in self.pending]) or real(self))
    times = floor.replay([floor.resident(b, CPU) for b in BATCHES], 7, t.model, t.state, CPU, t.cfg)
    assert len(times) == 4 and all(s > 0 for s in times)
    assert [r for r in reads if r] == [[7, 8], [9, 10]] and read_point(8, t.cfg.train) and read_point(10, t.cfg.train)


def test_a_data_parallel_run_and_a_run_without_it_say_so():
    t = SimpleNamespace(cfg=load_preset("tiny", ["train.floor.steps=5"]), stop=SimpleNamespace(requested=None),
                        group=SimpleNamespace(world=2), rec=SimpleNamespace(floor=None))
    loop._floor(t)
    assert t.rec.floor == {"steps": 5, "note": "not measured: a data-parallel run (2 processes)"}
    assert step_vs_floor({"floor": t.rec.floor}) == "not measured: a data-parallel run (2 processes)"
    off = SimpleNamespace(cfg=load_preset("tiny"), rec=SimpleNamespace(floor=None), stop=t.stop, group=t.group)
    loop._floor(off)
    assert off.rec.floor is None and step_vs_floor({"status": "success", "floor": None}) == FLOOR_OFF
    assert step_vs_floor({}) == "not measured (the run has not finished)" and floor_short({}) == ""


def test_the_floor_in_words():
    summary = {"floor": {"epoch": 2, "first_iteration": 80, "steps": 25, "floor_s": 0.0954, "loop_s": 0.103,
                         "loop_over_floor": 0.103 / 0.0954, "utterances": 126.0, "note": None}}
    assert step_vs_floor(summary) == "loop/floor 1.08 (0.1030 s against 0.0954 s a step, 25 steps of epoch 2)"
    assert floor_short(summary) == "; loop/floor 1.08"


def test_a_replay_that_fails_is_said_and_the_run_stands(monkeypatch):
    class Rec:
        floor = None

        def off_clock(self):
            import contextlib
            return contextlib.nullcontext()

    def out_of_memory(t, rows):
        raise RuntimeError("CUDA out of memory. Tried to allocate 1.30 GiB")

    monkeypatch.setattr(floor, "measure", out_of_memory)
    t = SimpleNamespace(cfg=load_preset("tiny", ["train.floor.steps=5"]), stop=SimpleNamespace(requested=None),
                        group=SimpleNamespace(world=1, device=CPU), rec=Rec(),
                        run=SimpleNamespace(rows=SimpleNamespace(iterations=list)))
    loop._floor(t)
    assert t.rec.floor == {"steps": 5, "note": "not measured: the replay failed: RuntimeError: CUDA out of memory. "
                                               "Tried to allocate 1.30 GiB"}
    assert step_vs_floor({"floor": t.rec.floor}).startswith("not measured: the replay failed: RuntimeError")


def test_the_second_of_two_passes_is_the_floor(monkeypatch):
    passes = []

    def fake(batches, first_iteration, model, state, device, cfg):
        passes.append(first_iteration)
        return [9.0] * len(batches) if len(passes) <= 3 else [1.0, 0.1]  # a slow first pass

    monkeypatch.setattr(floor, "replay", fake)
    got = floor.measure(_trainer(3, BATCHES), _rows_of(BATCHES, 7))
    assert passes == [7, 9, 8, 7, 9, 8] and got["floor_s"] == pytest.approx(0.1)


def test_any_first_windows_are_spread_over_the_run():
    assert floor.spread_order(8) == [0, 4, 2, 6, 1, 5, 3, 7]
    assert floor.spread_order(3) == [0, 2, 1] and floor.spread_order(1) == [0] and floor.spread_order(0) == []


def test_a_replay_past_its_deadline_compares_the_windows_both_passes_replayed(monkeypatch):
    """The estimate from the loop's median step can be wrong (a neighbour slows the replay 4x): the
    deadline stops each pass; at least one window is compared."""
    calls = _fixed_replay(monkeypatch)
    t = _trainer(3, BATCHES)
    windows = floor.pick_windows(TWO_EPOCHS, 3, 1)
    batches = [[floor.resident(b, CPU) for b in BATCHES[:2]]] * 3
    assert len(floor._replayed(t, batches, windows, deadline=time.perf_counter())) == 1 and calls == [2, 2]
    calls.clear()
    assert len(floor._replayed(t, batches, windows, deadline=time.perf_counter() + 60)) == 3 and len(calls) == 6


def test_the_sampled_floor_in_words():
    summary = {"floor": {"steps": 16, "asked": 16, "span": 1, "windows": 16, "epochs": 12, "first_iteration": 12,
                         "last_iteration": 950, "floor_s": 0.75, "loop_s": 0.91, "loop_over_floor": 1.21,
                         "loop_over_floor_p10": 1.05, "loop_over_floor_p90": 1.6, "run_over_floor": 1.19,
                         "outliers": [{"iteration": 85, "last": 85, "ratio": 2.9}, {"iteration": 86, "last": 86, "ratio": 1.9}],
                         "outlier_count": 3, "note": None}}
    assert step_vs_floor(summary) == ("loop/floor 1.21 (10-90%: 1.05-1.60; 16 step(s) over 12 epoch(s), iterations "
                                      "12-950; 0.9100 s against 0.7500 s a step; the run's median step 1.19); "
                                      "outliers: iterations 85 (2.90), 86 (1.90) and 1 more")
    assert floor_short(summary) == "; loop/floor 1.21"
    window = {**summary["floor"], "run_over_floor": None, "outliers": [{"iteration": 76, "last": 100, "ratio": 2.0}],
              "outlier_count": 1}
    assert step_vs_floor({"floor": window}).endswith("a step); outliers: iterations 76-100 (2.00)")
    beside = {**window, "replay_shared": True, "replay_others_pct": 67.4}
    assert step_vs_floor({"floor": beside}).endswith("(2.00); the replay shared its machine (other processes 67% of "
                                                     "its CPUs): a floor beside a neighbour")
