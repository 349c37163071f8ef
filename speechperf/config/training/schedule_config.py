"""``[train.schedule]``: the learning rate of every step (train/schedule.py)."""
from __future__ import annotations

from dataclasses import dataclass

from speechperf.section import doc_of, setting

SCHEDULES = ("epoch_decay", "step", "noam", "cosine", "newbob")  # train.schedule.name values (train/schedule.py)


@dataclass(frozen=True)
class ScheduleConfig:
    """The learning-rate schedule: its shape, warm-up and decay."""

    name: str = setting("epoch_decay", 'learning rate per step (train/schedule.py): "epoch_decay" (lr x '
                        'lr_decay^epochs done), "step" (lr x lr_decay^(epochs done // lr_step_epochs), torch\'s '
                        'StepLR), "noam" (warm-up, then x sqrt(warmup_iters/step)), "cosine" (warm-up, then down to '
                        'lr_min over train.stop.max_epochs), "newbob" (halved every epoch once the validation loss '
                        'improves < 1%; stops once it then improves < 0.1%)')
    warmup_iters: int = setting(0, "linear warm-up: step s (from 0) of the first N runs at lr x (s+1)/N, any "
                                "schedule")
    lr_decay: float = setting(1.0, "epoch_decay: multiply the learning rate by this after every epoch; step: after "
                              "every lr_step_epochs epochs")
    lr_step_epochs: int = setting(1, "step: epochs between two multiplications by lr_decay (StepLR's step_size)")
    lr_min: float = setting(0.0, "cosine: the learning rate at the end of train.stop.max_epochs epochs "
                            "(<= train.optim.lr)")

    def problems(self) -> list[str]:
        """One message per value that cannot train, naming ``train.schedule.FIELD=value``."""
        checks = [
            (self.warmup_iters >= 0, f"train.schedule.warmup_iters={self.warmup_iters} must be >= 0"),
            (self.lr_decay > 0, f"train.schedule.lr_decay={self.lr_decay} must be > 0"),
            (self.lr_step_epochs >= 1, f"train.schedule.lr_step_epochs={self.lr_step_epochs} must be >= 1"),
            (self.name in SCHEDULES, f"train.schedule.name={self.name!r} must be one of {', '.join(SCHEDULES)}"),
            (self.name != "noam" or self.warmup_iters >= 1,
             f"train.schedule.name=noam needs train.schedule.warmup_iters >= 1 (its peak), not {self.warmup_iters}"),
            (self.lr_min >= 0, f"train.schedule.lr_min={self.lr_min} must be in [0, train.optim.lr] "
                               f"({doc_of(ScheduleConfig, 'lr_min')})"),
        ]
        return [msg for ok, msg in checks if not ok]
