"""``[train.stop]``: when a run stops: its target, its epochs, its time cap, its divergence."""
from __future__ import annotations

from dataclasses import dataclass

from speechperf import metric
from speechperf.section import doc_of, setting


@dataclass(frozen=True)
class StopConfig:
    """The stopping rule: a target reached, epochs or minutes spent, or the run diverged."""

    target_metric: str = setting(metric.DEFAULT_TARGET, "what the stop rule watches: a target metric of "
                                 "speechperf/metric.py")
    target: float = setting(0.0, "stop once the median of the last target_epochs evals is <= this (percent); "
                            "0 = never")
    target_epochs: int = setting(3, "e of TTA(a, e): the evaluations whose median must reach the target")
    max_epochs: int = setting(50, "stop after this many epochs")
    time_cap_minutes: float = setting(0.0, "stop when the TTA clock passes this; 0 = no cap")
    after_epochs: int = setting(0, "stop after this many epochs, max_epochs unchanged (the cosine's length): a "
                                "reference's first epochs, reproduced (drive/reproduce.py); 0 = off")
    max_bad_losses: int = setting(100, "abort after this many consecutive NaN/inf losses")
    max_skipped_fraction: float = setting(0.5, "diverged when more than this share of the steps so far were "
                                          "skipped")

    def problems(self) -> list[str]:
        """One message per value that cannot run, naming ``train.stop.FIELD=value``."""
        checks = [
            (self.after_epochs >= 0, f"train.stop.after_epochs={self.after_epochs} must be >= 0 (0 = off)"),
            (self.time_cap_minutes >= 0,
             f"train.stop.time_cap_minutes={self.time_cap_minutes} must be >= 0 (0 = no cap)"),
            (self.target == 0 or metric.is_target(self.target),
             f"train.stop.target={self.target!r} must be an error rate in (0, 100] % (or 0: never stop early)"),
            (self.max_bad_losses >= 0, f"train.stop.max_bad_losses={self.max_bad_losses} must be >= 0"),
            (0 < self.max_skipped_fraction <= 1,
             f"train.stop.max_skipped_fraction={self.max_skipped_fraction} must be in (0, 1]"),
            (self.target_metric in metric.targets(),
             f"train.stop.target_metric={self.target_metric!r} must be one of {', '.join(metric.targets())} "
             f"({doc_of(StopConfig, 'target_metric')})"),
            (self.target_epochs >= 1, f"train.stop.target_epochs={self.target_epochs} must be >= 1"),
            (self.max_epochs >= 1, f"train.stop.max_epochs={self.max_epochs} must be >= 1"),
        ]
        return [msg for ok, msg in checks if not ok]
