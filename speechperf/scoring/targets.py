"""TTA targets, in one place: the named target sets, the protocol each belongs to, and the
check of explicit ones.

A named set's numbers were set for one benchmark protocol's workload (its data, features,
outputs, model, recipe and decoding); it is applied only to runs that record that protocol
(``train.protocol`` in the run's config.json, filled in by results/upgrade.py where it is missing):

- ``paper`` (protocol ``speechperf``): the DS2 paper's targets on real LibriSpeech
  dev-clean (docs/spec.md D), CER 10/8/7 and WER 22/20.2/19.2. speechperf applies them as
  thresholds on the run's own corpus, to every model: on real LibriSpeech with the paper's
  model they are the paper's targets; on the embedded synthetic corpus (the demo) or with
  another model they are thresholds of the same numbers, not the paper's accuracy.
- ``algoperf`` (protocol ``algoperf``): MLCommons AlgoPerf's validation WER targets on real
  LibriSpeech for its own workloads (``librispeech_conformer`` 8.5884,
  ``librispeech_deepspeech`` 11.9936). They mean AlgoPerf's result only for AlgoPerf's
  workload, which speechperf does not have yet (see ``ALGOPERF_DIFFERS``), so a run of
  speechperf's protocol asking for them is refused, saying what differs.

Explicit numbers (``--targets 10,8``) apply to the metric asked, for every run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from speechperf.errors import SpeechperfError
from speechperf.metric import CER, DEFAULT_TARGET, WER, is_target
from speechperf.metric import targets as declared_targets

METRICS = declared_targets()  # what a target may be of: the target metrics of speechperf/metric.py
PAPER = {CER.name: (10.0, 8.0, 7.0), WER.name: (22.0, 20.2, 19.2)}  # docs/spec.md D, LibriSpeech dev-clean
ALGOPERF_WER = {"conformer": 8.5884, "ds2": 11.9936}  # model family -> AlgoPerf's validation WER target
SPEECHPERF, ALGOPERF = "speechperf", "algoperf"  # benchmark protocols (a run's train.protocol)


@dataclass(frozen=True)
class TargetSet:
    """A named target set and the protocol whose workload its numbers were set for."""

    name: str  # what --targets takes
    protocol: str  # the protocol a run must record (train.protocol) for these targets to apply


SETS = {"paper": TargetSet("paper", SPEECHPERF), "algoperf": TargetSet("algoperf", ALGOPERF)}

# What AlgoPerf's workload of each model family has that a speechperf run does not (the
# conformer-algoperf-sizes preset matches its Conformer's parameters within 1.6% and FLOPs
# within 0.6%, nothing else below).
ALGOPERF_DIFFERS = {
    "conformer": "AlgoPerf's Conformer has its own features (a 25 ms frontend, 125-7600 Hz, fixed LibriSpeech "
                 "statistics), SentencePiece 1024 outputs (not 30 characters), BatchNorm in the convolution module "
                 "(not LayerNorm), one sinusoidal position embedding (not RoPE in every layer), no dropout on "
                 "attention weights or inside the feed-forward, greedy decoding without an LM, and every example "
                 "padded to 20 s",
    "ds2": "AlgoPerf's DeepSpeech is another model: 2-D convolution subsampling, 6 bidirectional LSTMs with "
           "residual connections and BatchNorm, 3 feed-forward layers and SentencePiece 1024 outputs, on "
           "AlgoPerf's own features, not speechperf's 1-D convolution and one-way LSTMs over 30 characters",
}


def run_protocol(config: dict) -> str:
    """The protocol a run's recorded configuration declares (``train.protocol``, as ``Run.config``
    reads it: results/upgrade.py fills it in for a run recorded before the field)."""
    return config["train"]["protocol"]


class TargetError(SpeechperfError):
    """A target that is not an error rate, or a target set that has none for a run."""


@dataclass(frozen=True)
class Targets:
    """What ``--targets`` names: a set (``name``) or explicit numbers (``values``, name None)."""

    name: str | None = "paper"  # a key of SETS ("paper", "algoperf"), or None for explicit values
    values: tuple[float, ...] = ()  # the explicit targets (% error)
    metric: str = DEFAULT_TARGET  # the metric the explicit targets are of

    def of(self, metric: str, model: str | None) -> tuple[float, ...]:
        """The targets of ``metric`` for a run of model family ``model``; () when this set has none."""
        if metric not in METRICS:
            raise TargetError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
        if self.name is None:
            return self.values if metric == self.metric else ()
        if self.name == "paper":
            return PAPER.get(metric, ())
        return (ALGOPERF_WER[model],) if metric == WER.name and model in ALGOPERF_WER else ()

    def check_run(self, config: dict, run: str) -> None:
        """Refuse (exit 2) a named set whose protocol is not the one ``run`` recorded in its
        ``config`` (config.json), saying which run and what differs. Explicit numbers apply
        to any run."""
        if self.name is None:
            return
        wanted, recorded = SETS[self.name].protocol, run_protocol(config)
        if recorded == wanted:
            return
        if wanted == ALGOPERF:
            model = config.get("model", {}).get("name", "ds2") if isinstance(config.get("model"), dict) else "ds2"
            differs = ALGOPERF_DIFFERS.get(model, f"AlgoPerf has no workload of model {model!r}")
            raise TargetError(
                f"--targets algoperf: run {run!r} is not AlgoPerf's workload: its config.json records "
                f"train.protocol={recorded!r} (speechperf's corpus, features and 30-symbol alphabet), and {differs}. "
                "AlgoPerf's targets measure AlgoPerf's workload only, and speechperf has no AlgoPerf-faithful "
                "workload yet; use --targets paper or error rates (e.g. --targets 10,8)")
        raise TargetError(f"--targets {self.name}: its targets are for runs of protocol {wanted!r}; run {run!r} "
                          f"records train.protocol={recorded!r}; give error rates instead")

    def require(self, metric: str, model: str | None) -> tuple[float, ...]:
        """:meth:`of`, refusing a metric or model this set gives no target for, by name."""
        found = self.of(metric, model)
        if not found:
            if self.name is None:
                raise TargetError(f"targets {self} are of {self.metric.upper()}, not {metric.upper()}")
            if self.name == "paper":
                raise TargetError(f"--targets paper has targets of {' and '.join(m.upper() for m in PAPER)} only, "
                                  f"none of {metric.upper()}: give error rates of it (e.g. --targets 50,40)")
            if metric != WER.name:
                raise TargetError(f"--targets {self.name}: AlgoPerf's targets are validation {WER.label}; "
                                  f"give --metric {WER.name}")
            raise TargetError(f"--targets {self.name} has no target for model {model!r} (it has: "
                              f"{', '.join(f'{m} {t}' for m, t in ALGOPERF_WER.items())}); give explicit targets")
        return found

    def __str__(self) -> str:
        return self.name or ",".join(f"{v:g}" for v in self.values)


def parse_targets(spec: "str | Targets | Sequence[float]", metric: str = DEFAULT_TARGET) -> Targets:
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
        raise TargetError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    return Targets(None, tuple(float(v) for v in values), metric)
