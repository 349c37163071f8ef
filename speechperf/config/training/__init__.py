"""Training loop configuration (docs/spec.md C): ``[train]`` and its sections.

A reader finds a setting by what it is about: ``[train.optim]`` (optimizer), ``[train.schedule]``
(learning-rate schedule), ``[train.eval]`` (evaluations), ``[train.stop]`` (stopping rule),
``[train.system]`` (device, processes, numerics, kernels), ``[train.floor]`` (the replayed
floor). Every field carries its documentation as data (``speechperf.section.setting``):
``speechperf train --help`` lists every key (:func:`key_table`), docs/presets.md holds the same
table (a test keeps it in sync). The flat keys of earlier releases (``train.lr``) are mapped to
these places by one table, :data:`speechperf.config.training.moved.MOVED`.
"""
from __future__ import annotations

from dataclasses import dataclass

from speechperf.config.training.eval_config import EvalConfig
from speechperf.config.training.floor_config import FloorConfig
from speechperf.config.training.optim_config import OPTIMIZERS, OptimConfig
from speechperf.config.training.schedule_config import SCHEDULES, ScheduleConfig
from speechperf.config.training.stop_config import StopConfig
from speechperf.config.training.system_config import AUTO_PRECISION, DIST_BACKENDS, PRECISIONS, SystemConfig
from speechperf.section import keys, part, setting

__all__ = ["AUTO_PRECISION", "DIST_BACKENDS", "OPTIMIZERS", "PRECISIONS", "PROTOCOLS", "SCHEDULES", "EvalConfig",
           "FloorConfig", "OptimConfig", "ScheduleConfig", "StopConfig", "SystemConfig", "TrainConfig", "key_markdown",
           "key_table", "target_rule"]

# train.protocol values: the benchmark protocols whose workload speechperf implements. Only its
# own; AlgoPerf's ("algoperf": its frontend, SentencePiece outputs, models and padding) is not
# implemented, so no run can claim it (scoring/targets.py refuses AlgoPerf's targets for these runs).
PROTOCOLS = ("speechperf",)


@dataclass(frozen=True)
class TrainConfig:
    """The training state machine: what it trains on, its seed, and its six sections."""

    protocol: str = setting("speechperf", "the benchmark protocol the run follows (speechperf's own): which named "
                            "TTA target sets apply")
    seed: int = setting(1, "seeds model init, data order and dropout")
    train_splits: str = setting("", 'comma-separated splits to train on; "" = every train-* split prepared '
                                '(all intact)')
    optim: OptimConfig = part(OptimConfig, "the optimizer")
    schedule: ScheduleConfig = part(ScheduleConfig, "the learning-rate schedule")
    eval: EvalConfig = part(EvalConfig, "the evaluations")
    stop: StopConfig = part(StopConfig, "the stopping rule")
    system: SystemConfig = part(SystemConfig, "device, processes, numerics and kernels")
    floor: FloorConfig = part(FloorConfig, "the replayed steps of the loop's floor")

    def problems(self) -> list[str]:
        """One message per value that would fail later or cannot train, naming ``train.SECTION.FIELD=value``."""
        cross = [
            (self.schedule.lr_min <= self.optim.lr,
             f"train.schedule.lr_min={self.schedule.lr_min} must be in [0, train.optim.lr={self.optim.lr}]"),
            (self.protocol in PROTOCOLS,
             f"train.protocol={self.protocol!r}: speechperf implements only {', '.join(PROTOCOLS)} "
             "(no AlgoPerf-faithful workload yet)"),
        ]
        sections = (self.stop, self.optim, self.schedule, self.eval, self.floor, self.system)
        return [msg for s in sections for msg in s.problems()] + [msg for ok, msg in cross if not ok]


def key_table() -> list[tuple[str, object, str]]:
    """(key, default, documentation) of every ``train.*`` setting, in declaration order."""
    return keys(TrainConfig, "train")


def key_markdown() -> str:
    """docs/presets.md's table of every ``train.*`` key (tests/config/test_train_keys.py keeps it in sync)."""
    rows = ["| key | default | what it sets |", "|---|---|---|"]
    for key, default, doc in key_table():
        rows.append(f"| `{key}` | `{default!r}` | {doc.replace('|', '/')} |")
    return "\n".join(rows)


def target_rule(train: dict) -> tuple[str, float, int]:
    """A run's stop rule from its configuration's ``train`` section (a recorded one as ``Run.config``
    reads it: results/upgrade.py moves an earlier release's flat keys into their sections and fills
    in a field recorded after the run): (target metric, target: 0 for none, evaluations whose
    median must reach it). The readers of finished runs (study, sweep) share it."""
    stop = train["stop"]
    return stop["target_metric"], stop["target"], stop["target_epochs"]
