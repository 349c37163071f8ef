"""A transducer run's evaluation with the beam search batched over utterances, against the same
search one utterance at a time, and against greedy search.

Why: ``transducer-cpu`` evaluates every epoch with the ALSD beam search (objectives/transducer_search.py),
which gives the same trained model a CER 0.3-0.7 lower than greedy search (docs/presets.md); one
utterance at a time it cost ~3.6x greedy's evaluation (each step of each utterance a joint call
and a prediction step). ``beam_batch`` gives every utterance of a batch's hypotheses one joint
call and one prediction step a step; the choice of each utterance's beam stays on the host, per
utterance, so the texts are the same (checked here, text for text, besides the tests).

The arms evaluate the run's latest checkpoint on one split through the training loop's own
evaluation (train/evaluate.py) on the CPU, in turn, for ``--rounds`` rounds (alternating keeps a
drifting machine's speed out of the ratios); each arm's median seconds are compared.

Usage: python benchmarks/run.py transducer_beam --run RUN [--split dev-clean] [--beam 4] [--rounds 3]
           [--precision fp32|bf16] [--data FEATS]
"""
from __future__ import annotations

import statistics
from pathlib import Path

import torch

from speechperf.data.batching import Batching
from speechperf.errors import SpeechperfError
from speechperf.models.rnnt import durations_of
from speechperf.objectives import tdt
from speechperf.objectives.transducer_search import beam_search
from speechperf.studies.evaluate_run import load_run_model
from speechperf.train.evaluate import evaluate

GOAL = ("docs/presets.md: a transducer's beam-search evaluation batched over utterances faster than one "
        "utterance at a time, the same texts")
REFERENCE = "the same ALSD beam search one utterance at a time (each utterance's own joint and prediction calls)"
RATIO = "batched / one at a time (median evaluation seconds)"
DATA = False
ARMS = ("one-at-a-time", "batched", "greedy")


def arguments(p) -> None:
    p.add_argument("--run", type=Path, default=None, help="a transducer run folder with a checkpoint (required)")
    p.add_argument("--split", default="dev-clean")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3, help="evaluations of each arm, taken in turn")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="the evaluation's autocast")


def one_at_a_time(core, out, out_lens, beam: int) -> list[list[int]]:
    """The reference arm: each utterance's ALSD alone, its valid frames only."""
    return [beam_search(core, out[b, : int(out_lens[b])], beam=beam) for b in range(len(out_lens))]


def _evaluate(arm: str, model, cfg, feats: Path, a) -> dict:
    batched = tdt.beam_tokens
    if arm == "one-at-a-time":  # tdt.decode looks beam_tokens up at each call
        tdt.beam_tokens = one_at_a_time
    try:
        return evaluate(model, feats, a.split, Batching(cfg.loader), torch.device("cpu"),
                        decoder="greedy" if arm == "greedy" else "beam", beam=a.beam, precision=a.precision,
                        keep_pairs=1 << 30)
    finally:
        tdt.beam_tokens = batched


def run(a) -> dict:
    if a.run is None:
        raise SpeechperfError("transducer_beam needs --run RUN: a transducer run folder with a checkpoint "
                              "(speechperf demo --preset transducer-cpu makes one)")
    model, cfg, feats, _ = load_run_model(a.run, a.data)
    if cfg.model.name != "transducer" or durations_of(cfg.model):
        raise SpeechperfError(f"{a.run}: model {cfg.model.name!r} is not an RNN-T transducer")
    seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
    last: dict[str, dict] = {}
    for arm in ARMS:  # untimed: the first pass reads the split and warms the kernels
        _evaluate(arm, model, cfg, feats, a)
    for _ in range(a.rounds):
        for arm in ARMS:
            last[arm] = _evaluate(arm, model, cfg, feats, a)
            seconds[arm].append(last[arm]["eval_s"])
    texts = {arm: [p["hyp"] for p in last[arm]["pairs"]] for arm in ARMS}
    if texts["batched"] != texts["one-at-a-time"]:
        differ = sum(x != y for x, y in zip(texts["batched"], texts["one-at-a-time"]))
        raise SpeechperfError(f"the batched beam search decoded {differ} of {len(texts['batched'])} utterances "
                              "differently from the one-at-a-time search")
    med = {arm: statistics.median(v) for arm, v in seconds.items()}
    print(f"run {a.run}")  # its own line: a long path keeps the others within 100 columns
    print(f"split {a.split} ({len(texts['batched'])} utterances), beam {a.beam}, cpu, {a.precision}, "
          f"threads {torch.get_num_threads()}, {a.rounds} rounds")
    print("the texts of both beam arms are the same")
    print(f"{'arm':<15}{'eval s (median)':>16}{'min':>9}{'max':>9}{'CER':>8}{'/ one at a time':>17}")
    for arm in ARMS:
        v = seconds[arm]
        print(f"{arm:<15}{med[arm]:>16.2f}{min(v):>9.2f}{max(v):>9.2f}{last[arm]['cer']:>8.2f}"
              f"{med[arm] / med['one-at-a-time']:>17.3f}")
    return {"run": a.run.name, "split": a.split, "beam": a.beam, "precision": a.precision,
            "threads": torch.get_num_threads(), "rounds": a.rounds, "utterances": len(texts["batched"]),
            **{f"{arm.replace('-', '_')}_s": med[arm] for arm in ARMS},
            **{f"{arm.replace('-', '_')}_cer": last[arm]["cer"] for arm in ARMS},
            "ratio": med["batched"] / med["one-at-a-time"], "greedy_ratio": med["greedy"] / med["batched"]}
