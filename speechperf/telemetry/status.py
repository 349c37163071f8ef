"""A live one-line training status on a terminal (nothing when output is not a TTY)."""
from __future__ import annotations

import sys
import time

from speechperf.metric import metric


class StatusLine:
    """Rewrites one line at most ``every`` seconds: epoch, iteration, loss, throughput, the
    run's target metric (its last validation value), clock."""

    def __init__(self, target: str, stream=None, every: float = 0.5):
        self.target = metric(target)  # the run's train.stop.target_metric (speechperf/metric.py)
        self.stream = stream or sys.stdout
        self.enabled = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.every, self.last = every, 0.0

    def update(self, epoch: int, iteration: int, loss: float, utts_per_s: float, error: float | None, clock_s: float,
               audio_s_per_s: float | None = None) -> None:
        """``error``: the target metric's last validation value (None before the first)."""
        now = time.monotonic()
        if not self.enabled or now - self.last < self.every:
            return
        self.last = now
        error_txt = f"{error:{self.target.fmt}}" if error is not None else "-"
        audio = f"{audio_s_per_s:7.0f} audio s/s " if audio_s_per_s is not None else ""
        self.stream.write(f"\repoch {epoch} it {iteration} loss {loss:8.3f} {utts_per_s:6.1f} utt/s {audio}"
                          f"{self.target.label} {error_txt} TTA clock {clock_s / 60:6.2f} min ")
        self.stream.flush()

    def clear(self) -> None:
        """End the status line before other output."""
        if self.enabled and self.last:
            self.stream.write("\n")
            self.last = 0.0
