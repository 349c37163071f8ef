"""How a run cuts its audio into batches, described once: the object every reader of it asks.

A :class:`Batching` is the run's loader settings (``loader.*``), its seed and its processes
(``world``). The run's admission checks the training splits against it (``checked_batch``: the
global batch a split must hold, none when batches are cut by duration), the trainer plans every
epoch and counts the schedule's steps from it, the recorder logs MLPerf's ``global_batch_size``
from it (:meth:`Batching.mlperf_batch`), and evaluation cuts its batches by
:meth:`Batching.for_eval`, the one place ``loader.eval_max_duration`` replaces
``loader.max_duration``. ``bench feed`` measures batches of a fixed count:
:meth:`Batching.by_count`. The cut itself is data/plan.py's, a pure function of (seed, epoch).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from speechperf.data.index import Index
from speechperf.data.loader_config import LoaderConfig
from speechperf.data.plan import Plan, global_batch, method, plan_epoch, steps_per_epoch

# A streamed evaluation's windows (readers own whole windows; a batch never spans two) each hold
# at least this many evaluation batches of audio, where the batches are sized for evaluation: a
# window's last batch is cut short, so smaller windows would multiply the batches again
EVAL_WINDOW_BATCHES = 4


@dataclass(frozen=True)
class Batching:
    """A run's batches: its loader settings, seed and processes (data/plan.py cuts them)."""

    loader: LoaderConfig
    seed: int = 0  # train.seed: every epoch's plan is a function of (seed, epoch)
    world: int = 1  # processes the epoch is dealt to (duration batches go whole to one rank)

    @property
    def method(self) -> str:
        """``full``, ``balanced`` or ``duration`` (data/plan.py)."""
        return method(self.loader)

    @property
    def batch_seconds(self) -> float:
        """Padded seconds of audio per batch per rank where batches are cut by duration; 0: by count."""
        return self.loader.max_duration

    @property
    def resident(self) -> bool:
        """Whether the training split stays on the device after epoch 1 (data/resident.py)."""
        return self.loader.resident

    @property
    def checked_batch(self) -> int | None:
        """The global batch the training splits must hold (data/check.py); None: batches are cut
        by duration and have no configured count."""
        return None if self.method == "duration" else self.loader.batch_size

    def plan(self, index: Index, epoch: int, rank: int = 0) -> Plan:
        """Rank ``rank``'s batches of ``epoch``."""
        return plan_epoch(index, self.loader, epoch, self.seed, rank, self.world)

    def steps_per_epoch(self, index: Index, utterances: int | None = None) -> int:
        """Optimizer steps of one epoch, the learning-rate schedule's unit (data/plan.py)."""
        return steps_per_epoch(index, self.loader, self.seed, self.world, utterances)

    def mlperf_batch(self, index: Index) -> tuple[int, dict]:
        """MLPerf's ``global_batch_size`` (an integer) and its metadata: the configured batch, or
        for duration batches the rounded mean utterances a step of every rank took, with the exact
        mean and ``max_duration`` beside it."""
        if self.method != "duration":
            return self.loader.batch_size, {}
        mean = global_batch(index, self.loader, self.seed, self.world)
        return max(1, round(mean)), {"batching": "duration", "mean_utterances": round(mean, 3),
                                     "max_duration_s": self.loader.max_duration}

    def by_count(self) -> "Batching":
        """The same settings with batches of ``loader.batch_size`` utterances (duration off)."""
        return replace(self, loader=replace(self.loader, max_duration=0.0))

    def for_eval(self, index: Index) -> LoaderConfig:
        """The loader settings of a pass over a split (its compact ``index``): in order (no shuffle,
        SortaGrad or paper padding). Training-sized batches (``eval_max_duration`` 0): the training
        loader's, and with several readers windows small enough that every reader gets some where
        the split has a shard per reader (a dev split of 43 shards inside one 128-shard window was
        one reader's work); one reader: the training windows, unchanged. Evaluation-sized batches:
        at most ``eval_max_duration`` padded seconds each, in one window per reader only where each
        window still holds ``EVAL_WINDOW_BATCHES`` of them, else fewer windows, down to the whole
        split sorted as one (the fewest batches; its reader decompresses with every configured
        reader's threads)."""
        shards = len(index.keys)
        cfg = replace(self.loader, shuffle=False, mode="bucket", sort_first_epoch=False)
        if cfg.eval_max_duration <= 0:
            window = cfg.bucket_window if cfg.readers <= 1 else min(cfg.bucket_window, max(1, shards // cfg.readers))
            return replace(cfg, bucket_window=window)
        room = int(float(index.duration.sum()) // (EVAL_WINDOW_BATCHES * cfg.eval_max_duration))
        windows = max(1, min(cfg.readers, shards, room))
        return replace(cfg, max_duration=cfg.eval_max_duration, bucket_window=-(-shards // windows))
