"""Where a training run stands, and the clock it is timed by (saved in every checkpoint)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field



@dataclass
class Progress:
    """Where a run stands; saved in every checkpoint."""

    epoch: int = 1  # current epoch (1-based): the next one to train
    start_batch: int = 0  # next batch of the current epoch
    iteration: int = 0  # optimizer steps attempted so far
    clock_s: float = 0.0  # TTA clock at the last checkpoint
    skipped_steps: int = 0  # steps skipped for non-finite loss or gradients
    consecutive_bad: int = 0  # skipped steps in a row (abort at max_bad_losses)
    impossible_utts: int = 0  # utterances whose labels cannot fit the output frames
    evals: list = field(default_factory=list)  # per-epoch history: {clock_s, metric: value} dicts
    eval_losses: list = field(default_factory=list)  # validation loss of every epoch, on every rank (newbob reads it)
    log_sizes: dict = field(default_factory=dict)  # byte sizes of the append-only logs at the checkpoint
    status: str | None = None  # why training stopped: success, time_cap, max_epochs (None: running)
    resumed_after: list = field(default_factory=list)  # epochs after which the run was restarted
    init_s: float = 0.0  # initialization seconds outside the TTA clock, summed over (re)starts

    @classmethod
    def from_dict(cls, d: dict) -> "Progress":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})


class Clock:
    """TTA seconds: started at run_start (after initialization), counting only the time this
    process (and, through ``base``, the processes the run resumed from) ran."""

    def __init__(self, base: float = 0.0):
        self.base, self.t0 = base, time.perf_counter()

    def now(self) -> float:
        return self.base + time.perf_counter() - self.t0
