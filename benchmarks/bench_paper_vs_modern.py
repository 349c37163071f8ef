"""The paper's recipe against the modern one on the same GPU, corpus and CER target.

``paper``: pad to 1670 frames, fp32 (cuDNN may use TF32), AdaDelta (presets/paper.toml);
``modern``: length buckets, bf16, fused AdamW (presets/modern.toml). Both read losses every
``--sync`` steps (a loop setting, not part of either recipe), so the comparison measures the
recipes. A corpus of ``--hours`` is synthesized and prepared under OUT (or ``--data FEATS`` is
trained on), both presets train to ``--target`` within ``--cap`` minutes, then one TTA table
(paper the reference, 100) and one report of both runs (OUT/report/index.html). Finished runs are
kept and interrupted ones resumed: delete OUT/paper or OUT/modern to measure again.

Goal (docs/gpu.md): on one H100 modern reaches the target in at most half the paper's TTA.

Usage: python benchmarks/run.py paper_vs_modern [--out paper_vs_modern] [--hours 8] [--target 10]
           [--cap 30] [--sync 25] [--data FEATS] [--cpu]
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from speechperf.errors import SpeechperfError

GOAL = "docs/gpu.md: on one GPU modern reaches the CER target in at most half the paper recipe's TTA"
REFERENCE = "the paper preset's TTA, trained in the same call on the same features"
RATIO = "modern TTA / paper TTA"
DATA = False


def sp(*args: str, capture: bool = False) -> str:
    """``speechperf ARGS`` (its output captured or shown); its failure, already said in its own
    words, ends the benchmark with its exit status."""
    done = subprocess.run([sys.executable, "-m", "speechperf", *args], text=True,
                          stdout=subprocess.PIPE if capture else None)
    if done.returncode:
        err = SpeechperfError(f"`speechperf {args[0]}` exited {done.returncode}")
        err.exit_code = done.returncode
        raise err
    return done.stdout if capture else ""


def train(preset: str, run: Path, feats: Path, overrides: list[str]) -> None:
    """One preset's run: kept when finished, resumed when interrupted, else trained."""
    if (run / "summary.json").is_file():
        print(f"{run} finished: kept", flush=True)
    elif (run / "checkpoint.pt").is_file():
        sp("train", "--resume", str(run))
    else:
        sp("train", "--preset", preset, "--data", str(feats), "--out", str(run), *overrides)


def tta_minutes(runs: list[Path], target: float) -> list[float | None]:
    """Each run's minutes to dev-clean CER ``target`` as ``speechperf tta`` reads them (None: never reached)."""
    rows = json.loads(sp("tta", *map(str, runs), "--json", "--metric", "cer", "--targets", str(target),
                         capture=True))["runs"]
    return [r.get("minutes") for r in rows]


def arguments(p) -> None:
    p.add_argument("--out", type=Path, default=Path("paper_vs_modern"), help="corpus, features, runs and report")
    p.add_argument("--hours", type=float, default=8.0, help="hours of corpus to synthesize (without --data)")
    p.add_argument("--target", type=float, default=10.0, help="CER %% both train to")
    p.add_argument("--cap", type=float, default=30.0, help="minutes each run may train")
    p.add_argument("--sync", type=int, default=25, help="train.system.sync_every of both runs")
    p.add_argument("--cpu", action="store_true", help="train on the CPU in fp32 (a dry run of the flow, no figure)")


def run(a) -> dict:
    if not (a.cpu or torch.cuda.is_available()):
        raise SpeechperfError("no CUDA device: the comparison is for one GPU (--cpu runs the flow on the CPU)")
    feats = a.data
    if feats is None:
        feats = a.out / "features"
        if not (feats / "features.json").is_file():
            sp("corpus", "synth", str(a.out / "corpus"), "--hours", str(a.hours))
            sp("prepare", str(a.out / "corpus"), str(feats))
    runs = [a.out / p for p in ("paper", "modern")]
    overrides = [f"train.stop.target={a.target}", f"train.stop.time_cap_minutes={a.cap}", f"train.system.sync_every={a.sync}",
                 *(["train.system.device=cpu", "train.system.precision=fp32"] if a.cpu else [])]
    for preset, folder in zip(("paper", "modern"), runs):
        train(preset, folder, feats, overrides)
    sp("tta", *map(str, runs), "--metric", "cer", "--targets", str(a.target))
    sp("report", *map(str, runs), "--out", str(a.out / "report"))
    paper, modern = tta_minutes(runs, a.target)
    return {"target": a.target, "paper_min": paper, "modern_min": modern,
            "ratio": modern / paper if paper and modern else None}
