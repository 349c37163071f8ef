"""The learning-rate schedule shared by every algorithm in paper 003 ("newbob"): keep the
rate while the cross-validation loss improves by at least 1% per epoch; from the first
epoch that improves less, halve it after every epoch; stop when an epoch improves by less
than 0.1%. ``train.schedule.name=newbob`` (train/schedule.py) replays it over the run's
validation losses."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class NewBob:
    lr: float  # current learning rate
    keep_threshold: float = 0.01  # relative improvement needed to keep the rate
    stop_threshold: float = 0.001  # relative improvement below which training stops
    halving: bool = False  # once started, halve every epoch
    best: float | None = None  # previous epoch's CV loss
    stop: bool = False

    def step(self, cv_loss: float) -> float:
        """Record an epoch's CV loss; returns the learning rate for the next epoch."""
        if self.best is not None:
            gain = (self.best - cv_loss) / self.best
            if gain < self.stop_threshold and self.halving:
                self.stop = True
            if gain < self.keep_threshold:
                self.halving = True
        if self.halving:
            self.lr /= 2
        self.best = cv_loss if self.best is None else min(self.best, cv_loss)
        return self.lr
