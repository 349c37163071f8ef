"""The TTA rule (docs/spec.md D): a run reaches target a at the first evaluation where the median
of the last e per-epoch evaluations is at most a; its time to accuracy is the TTA clock there."""
from __future__ import annotations

import math
import statistics
from typing import Sequence

from speechperf.errors import SpeechperfError


def tta_minutes(evals: Sequence[tuple[float, float]], target: float, epochs: int = 3) -> float | None:
    """``evals``: (TTA clock seconds, error %) per epoch in epoch order -> minutes or None.

    The median is taken over exactly the last ``epochs`` evaluations, so the earliest
    possible TTA is at the ``epochs``-th evaluation: accuracy must be persistent.
    """
    reached = epochs_to_target(evals, target, epochs)
    return None if reached is None else evals[reached - 1][0] / 60.0


def epochs_to_target(evals: Sequence[tuple[float, float]], target: float, epochs: int = 3) -> int | None:
    """How many evaluations (epochs) it took until the TTA rule first held: TTA is the clock at
    that evaluation (:func:`tta_minutes`); None when never. The recipe's factor of TTA. An
    error of None (an epoch that did not measure the metric: results/upgrade.py) counts
    as infinite: the rule then holds only where it holds whatever that error was."""
    if epochs < 1:
        raise SpeechperfError(f"epochs must be >= 1, got {epochs}")
    for i in range(epochs - 1, len(evals)):
        window = [math.inf if v is None else v for _, v in evals[i - epochs + 1 : i + 1]]
        if statistics.median(window) <= target:
            return i + 1
    return None


def relative_pct(minutes: float | None, reference: float | None) -> float | None:
    """``minutes`` in % of the ``reference`` run's TTA: exactly 100 for the reference itself
    (100 x minutes / reference rounds 12.8338... min against itself to 99.99999999999999)."""
    return 100.0 * (minutes / reference) if minutes is not None and reference else None
