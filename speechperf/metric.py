"""The metrics of an evaluation, declared once: every reader and writer of evaluations reads them here.

An evaluation (``train/evaluate.py``'s result, an ``evals`` row, an entry of
``Progress.evals``) is a mapping from a metric's name to its value, and to its 95% interval
(``NAME_lo``, ``NAME_hi``) where the metric has one. A metric declared below is then, without
another edit: a column of the ``evals`` table (results/schema.py; added to an older database
opened for writing: results/db.py), a part of every epoch and final line the train loop
prints, in the stop rule's history and the summary's ``last_NAME`` (a target metric), a
choice of ``tta --metric``, ``report --metric`` and ``train.stop.target_metric`` (a target
metric), a column of ``tta --json``'s evaluations, of the beam sweep (``beam_sweep`` rows,
the command's table, the report's) and of the report's validation and final tables, a
panel of Fig. 7, a column of ``train --seeds`` and ``parallel sweep``, a value of reference
curves (a target metric), and what ``eval_accuracy`` in events.log and the live status line
show when it is the run's ``train.stop.target_metric``. Its interval comes from the per-utterance
counts it names (``counts``: two fields of :class:`speechperf.scoring.error_rates.UtteranceErrors`,
resampled by scoring/bootstrap.py). A row without a value of it (None: results/upgrade.py fills
in a column recorded after the row) is shown "not measured" (None, NA), never 0. The one default target metric is
:data:`DEFAULT_TARGET`. No other module spells a metric's name (tests/test_metric_names.py):
code that means one metric names its declaration (:data:`WER`).

This module sits at the bottom of the package, beside the registry (it imports only the errors
and the registry), so that every layer reads it: the configuration's checks, the results
database, the metrics, the training loop and the report. The computations live above it
(scoring/error_rates.py, scoring/bootstrap.py); here is only what each metric is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from speechperf.errors import SpeechperfError
from speechperf.registry import Registry


class MetricError(SpeechperfError):
    """A metric name that is not declared, or a declaration that cannot hold."""


@dataclass(frozen=True)
class Metric:
    """One metric of an evaluation."""

    name: str  # the key everywhere: evaluate()'s result, the evals column, --metric, train.stop.target_metric
    label: str  # in text: epoch lines, table headers ("CER %"), legends
    meaning: str  # what it measures, in words (the report's notes)
    unit: str = "%"  # of the value and of a target
    lower_is_better: bool = True  # an error rate: lower is better
    fmt: str = ".2f"  # how lines and text tables print a value
    target: bool = False  # a TTA target may be of it (per-epoch views: stop rule, validation table, Fig. 7)
    counts: tuple[str, str] | None = None  # UtteranceErrors fields (errors, reference lengths): its bootstrap interval

    def __post_init__(self):
        if self.target and not self.lower_is_better:  # studies/tta.py: a target is reached from above (<=)
            raise MetricError(f"metric {self.name!r}: a TTA target must be of a lower-is-better metric")

    @property
    def interval(self) -> bool:
        """Whether an evaluation holds its 95% interval (``NAME_lo``, ``NAME_hi``)."""
        return self.counts is not None

    @property
    def columns(self) -> tuple[str, ...]:
        """Its keys in an evaluation: the value, then the interval's ends where it has one."""
        return (self.name, f"{self.name}_lo", f"{self.name}_hi") if self.interval else (self.name,)

    @property
    def header(self) -> str:
        """A table column's name: ``CER %``."""
        return f"{self.label} {self.unit}"

    def text(self, row: dict) -> str | None:
        """``9.36 [8.10, 10.70]``: its value in ``row`` with the interval where the row holds it;
        None where the row holds no value (not measured)."""
        value = row.get(self.name)
        if value is None:
            return None
        low, high = row.get(f"{self.name}_lo"), row.get(f"{self.name}_hi")
        inside = f" [{low:{self.fmt}}, {high:{self.fmt}}]" if low is not None and high is not None else ""
        return f"{value:{self.fmt}}{inside}"


METRICS: Registry = Registry("metric")  # name -> Metric, in declaration order (the order of columns and lines)


def declare(m: Metric) -> Metric:
    """Declare ``m`` (a name declared twice is refused)."""
    return METRICS.register(m.name)(m)


# Code that means one metric in particular (the paper's targets are of CER and WER, AlgoPerf's of
# WER) names its declaration below, never its name as a string.
CER = declare(Metric("cer", "CER", "character edits / reference characters", target=True,
                     counts=("char_edits", "ref_chars")))
WER = declare(Metric("wer", "WER", "word edits (S + D + I) / reference words, as jiwer", target=True,
                     counts=("word_edits", "ref_words")))
CER_PAPER = declare(Metric("cer_paper", "CER paper",
                           "character edits / the longer of hypothesis and reference (the paper's)"))
SER = declare(Metric("ser", "SER", "utterances with any word error / utterances (Kaldi's %SER)", target=True,
                     counts=("sentence_errors", "sentences")))

# The target metric where none is named: train.stop.target_metric's default (results/upgrade.py's for a
# run recorded without it), ``--metric`` of tta and report, the studies' and TTA functions' default.
DEFAULT_TARGET: str = CER.name


def metric(name: str) -> Metric:
    """The metric ``name``; :class:`MetricError` naming the declared ones otherwise."""
    if name not in METRICS:
        raise MetricError(f"unknown metric {name!r}; declared: {', '.join(METRICS)}")
    return METRICS[name]


def targets() -> tuple[str, ...]:
    """The names a TTA target may be of (``--metric``, ``train.stop.target_metric``), in declaration order."""
    return tuple(name for name, m in METRICS.items() if m.target)


def is_target(value) -> bool:
    """A TTA target of a target metric (an error rate): a finite number in (0, 100] (%). The one
    rule for ``--targets``, ``train.stop.target`` and a reference file's targets."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0 < value <= 100


def per_epoch() -> list[Metric]:
    """The metrics the per-epoch views show (the stop rule's history, the validation table, Fig. 7)."""
    return [m for m in METRICS.values() if m.target]


def columns() -> tuple[str, ...]:
    """Every metric key of an evaluation (the ``evals`` table's metric columns), in declaration order."""
    return tuple(c for m in METRICS.values() for c in m.columns)


def entry(clock_s: float, evaluation: dict) -> dict:
    """An epoch's entry of the stop rule's history (``Progress.evals``): the TTA clock and every
    per-epoch metric the evaluation holds."""
    return {"clock_s": clock_s, **{m.name: evaluation[m.name] for m in per_epoch()
                                   if evaluation.get(m.name) is not None}}


def held(rows: list[dict], metrics=None) -> list[Metric]:
    """Of ``metrics`` (default: every declared one), those some row holds a value of: a metric
    no run measured gets no column or panel (a run whose rows hold None shows none of it)."""
    return [m for m in (METRICS.values() if metrics is None else metrics)
            if any(r.get(m.name) is not None for r in rows)]


def measured(rows: list[dict], name: str) -> bool:
    """Whether ``rows`` (one run's evaluations) hold metric ``name``: rows holding None did not
    measure it, which is neither 0 nor a target never reached."""
    return any(r.get(name) is not None for r in rows)
