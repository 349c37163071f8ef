"""TTA targets, in one place: the named target sets and the check of explicit ones.

``paper``: the papers' targets on LibriSpeech dev-clean (SPEC D), CER 10/8/7 and WER
22/20.2/19.2, the same for every model. ``algoperf``: MLCommons AlgoPerf's validation WER
targets for real LibriSpeech, which depend on the workload (its ``librispeech_conformer``
and ``librispeech_deepspeech`` definitions): Conformer 8.5884, DeepSpeech 11.9936. Explicit
numbers (``--targets 10,8``) apply to the metric asked, for every model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from speechperf.errors import SpeechperfError

METRICS = ("cer", "wer")
PAPER = {"cer": (10.0, 8.0, 7.0), "wer": (22.0, 20.2, 19.2)}  # SPEC D, LibriSpeech dev-clean
ALGOPERF_WER = {"conformer": 8.5884, "ds2": 11.9936}  # model family -> AlgoPerf's validation WER target
SETS = ("paper", "algoperf")


class TargetError(SpeechperfError):
    """A target that is not an error rate, or a target set that has none for a run."""


@dataclass(frozen=True)
class Targets:
    """What ``--targets`` names: a set (``name``) or explicit numbers (``values``, name None)."""

    name: str | None = "paper"  # "paper", "algoperf", or None for explicit values
    values: tuple[float, ...] = ()  # the explicit targets (% error)
    metric: str = "cer"  # the metric the explicit targets are of

    def of(self, metric: str, model: str | None) -> tuple[float, ...]:
        """The targets of ``metric`` for a run of model family ``model``; () when this set has none."""
        if metric not in METRICS:
            raise TargetError(f"metric must be cer or wer, got {metric!r}")
        if self.name is None:
            return self.values if metric == self.metric else ()
        if self.name == "paper":
            return PAPER[metric]
        return (ALGOPERF_WER[model],) if metric == "wer" and model in ALGOPERF_WER else ()

    def require(self, metric: str, model: str | None) -> tuple[float, ...]:
        """:meth:`of`, refusing a metric or model this set gives no target for, by name."""
        found = self.of(metric, model)
        if not found:
            if self.name is None:
                raise TargetError(f"targets {self} are of {self.metric.upper()}, not {metric.upper()}")
            if metric != "wer":
                raise TargetError(f"--targets {self.name}: AlgoPerf's targets are validation WER; give --metric wer")
            raise TargetError(f"--targets {self.name} has no target for model {model!r} (it has: "
                              f"{', '.join(f'{m} {t}' for m, t in ALGOPERF_WER.items())}); give explicit targets")
        return found

    def __str__(self) -> str:
        return self.name or ",".join(f"{v:g}" for v in self.values)


def is_target(value) -> bool:
    """An error-rate target: a finite number in (0, 100] (%)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0 < value <= 100


def parse_targets(spec: "str | Targets | Sequence[float]", metric: str = "cer") -> Targets:
    """``paper``, ``algoperf``, comma-separated numbers, a :class:`Targets` or a list of numbers
    (numbers: targets of ``metric``); a value that is no error rate is refused as written."""
    if isinstance(spec, Targets):
        return spec
    if isinstance(spec, str) and spec.strip() in SETS:
        return Targets(spec.strip())
    written = [x.strip() for x in spec.split(",") if x.strip()] if isinstance(spec, str) else [repr(v) for v in spec]
    try:
        values = [float(x) for x in written] if isinstance(spec, str) else list(spec)
    except ValueError:
        raise TargetError(f"--targets {spec!r}: neither a target set ({', '.join(SETS)}) nor numbers") from None
    bad = [w for w, v in zip(written, values) if not is_target(v)]
    if bad:
        raise TargetError(f"TTA target {', '.join(bad)}: not an error rate in (0, 100] %")
    if not values:
        raise TargetError("no TTA target given")
    if metric not in METRICS:
        raise TargetError(f"metric must be cer or wer, got {metric!r}")
    return Targets(None, tuple(float(v) for v in values), metric)
