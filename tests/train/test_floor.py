"""The run's step against its floor (train/floor.py): which rows it replays, what it compares, and
that the run's model, optimizer, scaler and RNG are as before it."""
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


def test_the_second_epoch_is_replayed_where_it_has_the_steps():
    rows = _rows({1: 10, 2: 10, 3: 10})
    epoch, picked = floor.pick_rows(rows, 4)
    assert epoch == 2 and [r["iteration"] for r in picked] == [11, 12, 13, 14, 15]


def test_a_later_epoch_then_the_first_where_the_second_is_short():
    assert floor.pick_rows(_rows({1: 10, 2: 3, 3: 6}), 4)[0] == 3
    assert floor.pick_rows(_rows({1: 10, 2: 3}), 4)[0] == 1
    assert floor.pick_rows(_rows({1: 4, 2: 4}), 4) is None  # 5 rows needed: the first is untimed


def test_rows_with_a_gap_are_not_a_window():
    rows = [r for r in _rows({1: 3, 2: 8}) if r["iteration"] != 6]  # epoch 2 lost a row
    assert floor.pick_rows(rows, 4) is None and floor.pick_rows(rows, 3) is None  # the replay starts at batch 0
    assert floor.pick_rows(rows, 1) == (2, rows[3:5])  # epoch 2's first two rows: 4 and 5


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
    cfg = load_preset("tiny", [f"train.floor_steps={steps}", *over])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    optimizer = make_optimizer(model, cfg.train, CPU)
    state = TrainState(model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0),
                       torch.amp.GradScaler("cuda", enabled=False))
    loaders = []

    def epoch_loader(epoch):
        loaders.append(_Loader(batches))
        return loaders[-1]
    return SimpleNamespace(cfg=cfg, state=state, model=model, group=SimpleNamespace(device=CPU, world=1),
                           epoch_loader=epoch_loader, loaders=loaders)


BATCHES = [_batch((40, 30), 1), _batch((50, 20), 2), _batch((35, 35), 3), _batch((30, 25), 4)]


def _rows_of(batches, first: int, epoch: int = 2) -> list[dict]:
    return [{"iteration": first + i, "epoch": epoch, "batch_size": len(b.feat_lens), "frames": int(b.feat_lens.sum()),
             "step_s": 0.2 + 0.01 * i, "data_s": 0.05, "ckpt_s": 0.01 * (i == 2)} for i, b in enumerate(batches)]


def test_the_floor_sets_the_same_iterations_rows_against_the_replay():
    t = _trainer(3, BATCHES)
    rows = _rows_of(BATCHES, 7)
    got = floor.measure(t, _rows({1: 6}) + rows)
    loop_s = sum(floor.loop_seconds(r) for r in rows[1:]) / 3  # the first replayed step is untimed
    assert got["epoch"] == 2 and got["first_iteration"] == 8 and got["steps"] == 3 and got["note"] is None
    assert got["loop_s"] == pytest.approx(loop_s) and got["floor_s"] > 0
    assert got["loop_over_floor"] == pytest.approx(loop_s / got["floor_s"])
    assert got["utterances"] == 2
    assert len(t.loaders) == 1 and t.loaders[0].closed  # the replay's loader is stopped


def test_a_replayed_batch_unlike_its_row_is_not_compared():
    t = _trainer(3, BATCHES)
    rows = _rows_of(BATCHES, 7)
    rows[2]["frames"] += 1
    got = floor.measure(t, rows)
    assert got["note"] == "not compared: epoch 2's replayed batch of iteration 9 is not the one its row recorded"
    assert "loop_over_floor" not in got
    short = floor.measure(_trainer(3, BATCHES[:3]), _rows_of(BATCHES, 7))  # the plan gave fewer batches
    assert "iteration 10 is not the one" in short["note"]


def test_the_run_is_as_before_the_replay():
    t = _trainer(3, BATCHES, "train.optimizer=adamw")
    before = {k: v.clone() for k, v in t.state.model.state_dict().items()}
    optimizer = t.state.optimizer  # a state to put back: one step trained before it
    train_step(t.model, BATCHES[0], optimizer, t.state.scaler, CPU, t.cfg.train)
    t.model.eval()
    after_step = {k: v.clone() for k, v in t.state.model.state_dict().items()}
    moments = [s["exp_avg"].clone() for s in optimizer.state.values()]
    rng, np_rng = torch.get_rng_state(), np.random.get_state()[1].copy()
    got = floor.measure(t, _rows_of(BATCHES, 7))
    assert got["note"] is None
    assert all(torch.equal(v, after_step[k]) for k, v in t.state.model.state_dict().items())
    assert any(not torch.equal(after_step[k], before[k]) for k in before)  # the test's own step moved them
    assert all(torch.equal(s["exp_avg"], m) for s, m in zip(optimizer.state.values(), moments))
    assert torch.equal(torch.get_rng_state(), rng) and not t.model.training  # SpecAugment's draws, eval mode kept
    assert np.array_equal(np.random.get_state()[1], np_rng)


def test_the_replay_reads_where_the_loop_reads(monkeypatch):
    t = _trainer(3, BATCHES, "train.sync_every=2", "train.sentence_every=50", "train.checkpoint_every=50")
    reads = []
    real = StepMeter.read
    monkeypatch.setattr(StepMeter, "read", lambda self: reads.append([p.iteration for p in self.pending]) or real(self))
    times = floor.replay([floor.resident(b, CPU) for b in BATCHES], 7, t.model, t.state, CPU, t.cfg)
    assert len(times) == 4 and all(s > 0 for s in times)
    assert [r for r in reads if r] == [[7, 8], [9, 10]] and read_point(8, t.cfg.train) and read_point(10, t.cfg.train)


def test_a_data_parallel_run_and_a_run_without_it_say_so():
    t = SimpleNamespace(cfg=load_preset("tiny", ["train.floor_steps=5"]), stop=SimpleNamespace(requested=None),
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
    t = SimpleNamespace(cfg=load_preset("tiny", ["train.floor_steps=5"]), stop=SimpleNamespace(requested=None),
                        group=SimpleNamespace(world=1, device=CPU), rec=Rec(), run=SimpleNamespace(iterations=list))
    loop._floor(t)
    assert t.rec.floor == {"steps": 5, "note": "not measured: the replay failed: RuntimeError: CUDA out of memory. "
                                               "Tried to allocate 1.30 GiB"}
    assert step_vs_floor({"floor": t.rec.floor}).startswith("not measured: the replay failed: RuntimeError")


def test_the_second_of_two_passes_is_the_floor(monkeypatch):
    passes = []

    def fake(batches, first_iteration, model, state, device, cfg):
        passes.append(first_iteration)
        return [9.0] * len(batches) if len(passes) == 1 else [1.0, 0.1, 0.1, 0.1]  # a slow first pass

    monkeypatch.setattr(floor, "replay", fake)
    got = floor.measure(_trainer(3, BATCHES), _rows_of(BATCHES, 7))
    assert passes == [7, 7] and got["floor_s"] == pytest.approx(0.1)
