"""A run folder's latest checkpoint evaluated after training: ``speechperf eval`` (one split,
one beam width) and ``speechperf beam-sweep`` (Table 3 form: every declared metric per width).

Both load the checkpoint's weights into the model its configuration names and call the
training loop's own evaluation (train/evaluate.py), on the CPU, on the features folder the run
recorded (or ``data``, where it moved to another machine).
"""
from __future__ import annotations

from pathlib import Path

import torch

from speechperf import metric
from speechperf.config import RunConfig
from speechperf.data.batching import Batching
from speechperf.features.stats import check_trained_on
from speechperf.models import build_model, external
from speechperf.results import checkpoint, upgrade
from speechperf.results.run import Run
from speechperf.results.view import RunView
from speechperf.train.evaluate import evaluate


def load_run_model(run, data: Path | None = None):
    """(model with the run's latest weights, RunConfig, features folder, the open Run)."""
    r = run if not isinstance(run, (str, Path)) else RunView.open(Path(run), data=data)
    feats = r.features()  # a missing features folder fails before the checkpoint is read
    ckpt = checkpoint.load(r.folder)
    with external.reading(f"checkpoint of run {r.folder}"):  # its model's module: imported only where trusted
        cfg = RunConfig.from_dict(upgrade.config(ckpt[checkpoint.CONFIG]))  # an earlier release's flat train keys
    if cfg.loader.normalize:  # weights trained under one normalization are evaluated under it
        check_trained_on(feats, r.stats_sha256, r.folder)
    model = build_model(cfg.model)
    model.load_state_dict(ckpt[checkpoint.MODEL])
    return model, cfg, feats, r


def evaluate_run(run: Path, split: str = "dev-clean", decoder: str = "wordbeam", beam: int = 256,
                 workers: int = 0, mode: str = "ngrams", data: Path | None = None) -> dict:
    """``speechperf eval``: the run's latest checkpoint on ``split``; one row. ``data``: the
    features folder, where it is not where the run recorded it (another machine)."""
    model, cfg, feats, _ = load_run_model(Path(run), data)
    r = evaluate(model, feats, split, Batching(cfg.loader), torch.device("cpu"), decoder=decoder, beam=beam,
                 workers=workers, mode=mode, ctc_kernel=cfg.train.system.ctc_kernel)
    return {k: v for k, v in r.items() if k != "pairs"}


def beam_sweep(run: Path, widths: list[int], split: str = "dev-clean", decoder: str = "wordbeam",
               workers: int = 0, mode: str = "ngrams", data: Path | None = None,
               db_path: Path | None = None) -> list[dict]:
    """Table 3 form: evaluation seconds and every declared metric per beam width; rows also go to the run's
    database (and to ``db_path``, a shared one, if given)."""
    rows = []
    with Run.open(Path(run), data=data, shared_db=db_path) as r:
        model, cfg, feats, _ = load_run_model(r)
        for width in widths:
            e = evaluate(model, feats, split, Batching(cfg.loader), torch.device("cpu"), decoder=decoder, beam=width,
                         workers=workers, mode=mode, ctc_kernel=cfg.train.system.ctc_kernel)
            row = {"run_id": r.run_id, "split": split, "decoder": e["decoder"], "beam": e["beam"],
                   "eval_s": e["eval_s"],
                   **{c: e.get(c) for c in metric.columns()}, "n_utts": e["n_utts"], "device": "cpu"}
            r.rows.upsert("beam_sweep", row)
            rows.append(row)
    return rows
