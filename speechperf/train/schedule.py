"""The learning-rate schedule: a factor of ``train.optim.lr`` for every optimizer step.

``train.schedule.name`` (its values: config/training/schedule_config.py's ``SCHEDULES``):

- ``epoch_decay`` (the default, the paper's): ``lr_decay ** epochs_done``;
- ``step`` (torch's ``StepLR`` over epochs, MLPerf's step recipes): warm-up, then
  ``lr_decay ** (epochs_done // lr_step_epochs)``: constant, then multiplied by
  ``lr_decay`` after every ``lr_step_epochs`` epochs;
- ``noam`` (the Transformer's, as ESPnet and NeMo use it for Conformers): warm-up, then the
  inverse square root of the step, equal to 1 where the warm-up ends;
- ``cosine``: warm-up, then half a cosine from 1 down to ``lr_min / lr`` at the end of
  ``max_epochs`` epochs of steps (AlgoPerf's Conformer baseline), ``lr_min / lr`` after;
- ``newbob`` (paper 003's, train/newbob.py): 1 while the validation loss improves by at
  least 1% per epoch, then halved after every epoch; read from the validation losses of
  the epochs done (``prog.eval_losses``, on every rank, in the checkpoint). Its stopping
  rule (:func:`schedule_ended`: once halving, an epoch that improves by less than 0.1%)
  ends training as the last of ``max_epochs`` would.

``train.schedule.warmup_iters`` > 0 multiplies the first steps by ``(s + 1) / warmup_iters`` (linear
warm-up; ``s`` = steps done before this one) under every schedule. The factor is a pure
function of the steps and epochs done and of the validation losses so far (the run's
progress, in the checkpoint), so a resumed run gets every step's learning rate bit for bit.
"""
from __future__ import annotations

import math

import torch

from speechperf.train.newbob import NewBob


def warmup(step: int, warmup_iters: int) -> float:
    """Linear warm-up factor of the step after ``step`` steps: 1/W, 2/W, ..., 1, 1, ..."""
    return min(1.0, (step + 1) / warmup_iters) if warmup_iters > 0 else 1.0


def _replay(losses) -> NewBob:
    rule = NewBob(lr=1.0)
    for loss in losses:
        rule.step(loss)
    return rule


def newbob(losses) -> float:
    """Newbob's factor after the epochs whose validation losses are ``losses``."""
    return _replay(losses).lr


def schedule_ended(tc, losses) -> bool:
    """Whether the schedule stops training after the epochs whose validation losses are
    ``losses`` (newbob's stopping rule; the other schedules never stop a run)."""
    return tc.schedule.name == "newbob" and _replay(losses).stop


def factor(tc, step: int, epochs_done: int, total_steps: int, losses=()) -> float:
    """The learning-rate factor of the step after ``step`` steps, in epoch ``epochs_done + 1``;
    ``total_steps``: steps of ``max_epochs`` epochs (the cosine's length); ``losses``: the
    validation loss of every epoch done (newbob)."""
    w = tc.schedule.warmup_iters
    if tc.schedule.name == "epoch_decay":
        return warmup(step, w) * tc.schedule.lr_decay ** epochs_done
    if tc.schedule.name == "step":
        return warmup(step, w) * tc.schedule.lr_decay ** (epochs_done // tc.schedule.lr_step_epochs)
    if tc.schedule.name == "newbob":
        return warmup(step, w) * newbob(losses[:epochs_done])
    if step < w:
        return warmup(step, w)
    if tc.schedule.name == "noam":  # (s+1)/W rising, then sqrt(W/(s+1)) falling: 1 where they meet
        return math.sqrt(max(w, 1) / (step + 1))
    floor = tc.schedule.lr_min / tc.optim.lr
    done = min(1.0, (step - w) / max(total_steps - w, 1))
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * done))


def make_scheduler(optimizer, tc, prog, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` whose factor is read from ``prog`` (steps and epochs done), stepped by
    the loop before every step but a run's first (its constructor sets that one): the step
    after an epoch's end sees the new epoch's factor, and a checkpoint of the previous
    release (whose scheduler counted epochs) resumes with the right rates."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda _: factor(tc, prog.iteration, prog.epoch - 1, total_steps, prog.eval_losses))
