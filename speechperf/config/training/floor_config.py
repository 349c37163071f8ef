"""``[train.floor]``: the replayed steps that measure the loop's floor (train/floor.py)."""
from __future__ import annotations

from dataclasses import dataclass

from speechperf.section import setting


@dataclass(frozen=True)
class FloorConfig:
    """After training, outside the clock: the step's floor, replayed on batches already on the device."""

    steps: int = setting(0, "after training, outside the clock: replay this many steps, spread over the epochs in "
                         "windows of train.floor.window steps (at most 10% of the clock), on batches already on the "
                         "device and set the loop's rows against them (train/floor.py; the summary's \"floor\"); "
                         "0 = off")
    window: int = setting(0, "the timed steps of one replayed window, rounded up to whole train.system.sync_every "
                          "periods; 0 = one period (a CPU step's seconds vary: a window of several steps times "
                          "steadier)")

    def problems(self) -> list[str]:
        """One message per value that cannot run, naming ``train.floor.FIELD=value``."""
        checks = [
            (self.steps >= 0, f"train.floor.steps={self.steps} must be >= 0 (0 = off)"),
            (self.window >= 0, f"train.floor.window={self.window} must be >= 0 (0 = one sync_every period)"),
        ]
        return [msg for ok, msg in checks if not ok]
