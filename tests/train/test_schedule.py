"""The learning-rate schedule (train/schedule.py): exact factors at given steps, the
scheduler as the loop steps it, and the validation of its fields."""
import math
from dataclasses import replace

import pytest
import torch

from speechperf.config import ConfigError, load_preset
from speechperf.config.training import TrainConfig
from speechperf.results.progress import Progress
from speechperf.train.schedule import factor, make_scheduler, warmup


def tc(lr: float = 1.0, **schedule) -> TrainConfig:
    """A TrainConfig of these [train.schedule] fields and [train.optim] learning rate."""
    d = TrainConfig()
    return replace(d, optim=replace(d.optim, lr=lr), schedule=replace(d.schedule, **schedule))


def test_linear_warmup():
    assert [warmup(s, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup(0, 0) == 1.0


def test_epoch_decay_is_the_previous_per_epoch_rule():
    c = tc(lr_decay=0.5)
    assert [factor(c, 1000, e, 0) for e in range(4)] == [1.0, 0.5, 0.25, 0.125]
    # with a warm-up: the warm-up's share times the epoch's decay
    assert factor(tc(lr_decay=0.5, warmup_iters=4), 1, 1, 0) == 0.5 * 0.5


def test_step_is_torchs_steplr_over_epochs():
    """``step``'s factor per epoch is what ``torch.optim.lr_scheduler.StepLR`` gives (the
    reference), stepped once per epoch; a warm-up multiplies it as under every schedule."""
    c = tc(name="step", lr_decay=0.1, lr_step_epochs=3)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    ref = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.1)
    torch_rates = []
    for _ in range(8):
        torch_rates.append(opt.param_groups[0]["lr"])
        opt.step()
        ref.step()
    assert [factor(c, 1000, e, 0) for e in range(8)] == pytest.approx(torch_rates)
    assert [factor(c, 1000, e, 0) for e in range(8)] == pytest.approx([1, 1, 1, 0.1, 0.1, 0.1, 0.01, 0.01])
    assert factor(replace(c, schedule=replace(c.schedule, warmup_iters=4)), 1, 3, 0) == pytest.approx(0.5 * 0.1)


def test_noam_rises_to_one_then_falls_as_the_inverse_square_root():
    c = tc(name="noam", warmup_iters=4)
    assert [factor(c, s, 0, 0) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert factor(c, 15, 0, 0) == math.sqrt(4 / 16) == 0.5
    assert factor(c, 63, 7, 0) == 0.25  # the epoch does not matter


def test_cosine_goes_from_one_to_lr_min_at_the_end_and_stays():
    c = tc(name="cosine", warmup_iters=2, lr=1.0, lr_min=0.1)
    assert [factor(c, s, 0, 12) for s in range(2)] == [0.5, 1.0]
    assert factor(c, 2, 0, 12) == 1.0  # the cosine starts where the warm-up ends
    assert factor(c, 7, 0, 12) == pytest.approx(0.1 + 0.9 * 0.5)  # half way: cos(pi/2) = 0
    assert factor(c, 12, 0, 12) == pytest.approx(0.1)
    assert factor(c, 500, 0, 12) == pytest.approx(0.1)


def test_the_scheduler_as_the_loop_steps_it():
    """Stepped before every step but the first, the rate of the step after ``s`` steps in
    epoch ``e`` is ``lr * factor(s, e - 1)``; an epoch's end changes the next step's rate."""
    c = tc(lr=2.0, lr_decay=0.5, warmup_iters=2)
    prog = Progress()
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=c.optim.lr)
    sched = make_scheduler(opt, c, prog, 0)
    rates = []
    for epoch_len in (3, 3):
        for _ in range(epoch_len):
            if prog.iteration:
                sched.step()
            rates.append(opt.param_groups[0]["lr"])
            prog.iteration += 1
            opt.step()
        prog.epoch += 1
    assert rates == [1.0, 2.0, 2.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("override,message", [
    ("train.schedule.name=linear", "train.schedule.name='linear' must be one of epoch_decay, step, noam, cosine"),
    ("lr_step_epochs=0", "train.schedule.lr_step_epochs=0 must be >= 1"),
    ("train.schedule.name=noam", "train.schedule.name=noam needs train.schedule.warmup_iters >= 1"),
    ("lr_min=1.0", "train.schedule.lr_min=1.0 must be in [0, train.optim.lr=0.003]"),
    ("lr_min=-1.0", "train.schedule.lr_min=-1.0 must be in [0"),
])
def test_schedule_fields_are_validated(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(".", r"\.")):
        load_preset("tiny", [override])


def test_valid_schedules_load():
    assert load_preset("tiny", ["train.schedule.name=noam", "warmup_iters=10"]).train.schedule.name == "noam"
    assert load_preset("tiny", ["train.schedule.name=cosine", "lr_min=0.0001"]).train.schedule.lr_min == 0.0001


def test_the_loop_applies_the_schedule_and_a_resume_keeps_every_rate(tiny_features, tmp_path, monkeypatch):
    """Through the real loop: the warm-up's rates, then the cosine's falling ones; a run
    interrupted after a checkpoint and resumed sees the same rate at every step and ends
    with the uninterrupted run's weights."""
    from speechperf.train import loop
    from speechperf.train.request import TrainRequest
    from speechperf.results.checkpoint import load as load_checkpoint

    args = ["max_epochs=2", "threads=1", "checkpoint_every=3", "sentence_every=50", "train.schedule.name=cosine",
            "warmup_iters=4", "lr_min=0.0003"]
    real = loop.train_step

    def recording(rates, die_at=None):
        def step(model, batch, optimizer, *a, **kw):
            if len(rates) + 1 == die_at:
                raise KeyboardInterrupt
            rates.append(optimizer.param_groups[0]["lr"])
            return real(model, batch, optimizer, *a, **kw)
        return step

    ref_rates, rates, resumed = [], [], []
    monkeypatch.setattr(loop, "train_step", recording(ref_rates))
    loop.train(TrainRequest("tiny", tiny_features, tmp_path / "ref", args, quiet=True))
    assert ref_rates[:4] == [0.003 * f for f in (0.25, 0.5, 0.75, 1.0)]
    assert all(a > b for a, b in zip(ref_rates[4:], ref_rates[5:])) and ref_rates[-1] >= 0.0003

    monkeypatch.setattr(loop, "train_step", recording(rates, die_at=5))  # after the checkpoint at 3
    with pytest.raises(KeyboardInterrupt):
        loop.train(TrainRequest("tiny", tiny_features, tmp_path / "run", args, quiet=True))
    monkeypatch.setattr(loop, "train_step", recording(resumed))
    assert loop.train(TrainRequest("tiny", tiny_features, tmp_path / "run", args, quiet=True))["status"] == "success"
    assert rates == ref_rates[:4] and rates[:3] + resumed == ref_rates  # the resume trains from step 4
    a, b = load_checkpoint(tmp_path / "ref"), load_checkpoint(tmp_path / "run")
    assert all(torch.equal(v, b["model"][k]) for k, v in a["model"].items())


def test_newbob_replays_paper_003s_rule_over_the_validation_losses():
    from speechperf.train.newbob import NewBob
    from speechperf.train.schedule import newbob

    losses = [10.0, 8.0, 7.0, 6.97, 6.5, 6.499]
    rule = NewBob(lr=1.0)
    assert [newbob(losses[:e + 1]) for e in range(len(losses))] == [rule.step(x) for x in losses]
    assert [newbob(losses[:e]) for e in range(5)] == [1.0, 1.0, 1.0, 1.0, 0.5]  # 6.97: < 1% better
    c = tc(name="newbob", warmup_iters=2)
    assert factor(c, 0, 4, 0, losses) == 0.5 * 0.5  # warm-up x newbob of the first 4 epochs (6.5: later)
    assert factor(c, 100, 5, 0, losses) == 0.25


def test_the_newbob_scheduler_reads_the_losses_the_loop_appends():
    c = tc(lr=2.0, name="newbob")
    prog = Progress()
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=c.optim.lr)
    sched = make_scheduler(opt, c, prog, 0)
    rates = []
    for loss in (5.0, 4.0, 3.99, 3.9):  # 3.99: 0.25% better, newbob starts halving
        for _ in range(2):
            if prog.iteration:
                sched.step()
            rates.append(opt.param_groups[0]["lr"])
            prog.iteration += 1
            opt.step()
        prog.eval_losses.append(loss)
        prog.epoch += 1
    assert rates == [2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 1.0, 1.0]
    assert load_preset("tiny", ["train.schedule.name=newbob"]).train.schedule.name == "newbob"


def test_a_newbob_run_sets_every_epochs_rate_from_the_recorded_validation_losses(tiny_features, tmp_path,
                                                                                 monkeypatch):
    from speechperf.results import ResultsDB
    from speechperf.train import loop
    from speechperf.train.request import TrainRequest
    from speechperf.results.checkpoint import load as load_checkpoint
    from speechperf.train.schedule import newbob

    real, rates = loop.train_step, []

    def step(model, batch, optimizer, *a, **kw):
        rates.append((loop_epoch[0], optimizer.param_groups[0]["lr"]))
        return real(model, batch, optimizer, *a, **kw)

    loop_epoch = [1]
    real_eval = loop._epoch_eval

    def epoch_eval(*a, **kw):
        out = real_eval(*a, **kw)
        loop_epoch[0] += 1
        return out

    monkeypatch.setattr(loop, "train_step", step)
    monkeypatch.setattr(loop, "_epoch_eval", epoch_eval)
    loop.train(TrainRequest("tiny", tiny_features, tmp_path / "nb", ["max_epochs=3", "threads=1", "train.schedule.name=newbob",
                                                                      "final_splits=none"], quiet=True))
    losses = load_checkpoint(tmp_path / "nb")["progress"]["eval_losses"]
    with ResultsDB(tmp_path / "nb" / "results.db", readonly=True) as db:
        assert losses == [r["loss"] for r in db.query("SELECT loss FROM evals ORDER BY epoch")]
    assert len(losses) == 3
    for epoch, lr in rates:
        assert lr == pytest.approx(0.003 * newbob(losses[:epoch - 1]), rel=1e-12), epoch


def test_newbobs_stopping_rule_ends_the_run_as_its_last_epoch_would(tiny_features, tmp_path, monkeypatch):
    from speechperf.train import loop
    from speechperf.train.request import TrainRequest
    from speechperf.train.schedule import schedule_ended

    losses = [10.0, 8.0, 7.99, 7.989, 5.0, 4.0]  # 7.99: halving starts; 7.989: < 0.1% better while halving: stop
    assert [schedule_ended(tc(name="newbob"), losses[:e]) for e in range(5)] == [False] * 4 + [True]
    assert not schedule_ended(tc(), losses[:4])  # the other schedules never stop a run
    real = loop._epoch_eval

    def scripted(model, t):
        real(model, t)
        return None, losses[len(t.rec.prog.evals) - 1]

    monkeypatch.setattr(loop, "_epoch_eval", scripted)
    over = ["max_epochs=6", "threads=1", "train.schedule.name=newbob", "final_splits=none"]
    summary = loop.train(TrainRequest("tiny", tiny_features, tmp_path / "nb", over, quiet=True))
    assert summary["epochs"] == 4 and summary["status"] == "success"
