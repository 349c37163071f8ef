"""Evaluation of an acoustic model on a prepared split: CTC loss, WER and both CERs.

The per-epoch evaluation of the training loop and ``speechperf eval`` share
:func:`evaluate`; the model stays resident in the training process (no swapping to
disk), and the seconds spent here are recorded apart from training time.
"""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from speechperf.data.config import LoaderConfig
from speechperf.metrics.bootstrap import error_intervals
from speechperf.metrics.errors import error_rates, utterance_errors
from speechperf.models.contract import autocast, planned_forward
from speechperf.config import RunConfig
from speechperf.data.loader import load_index, make_loader
from speechperf.decode import get_decoder
from speechperf.features.stats import check_trained_on
from speechperf.models import build_model
from speechperf.results.run import Run


def make_decoder(name: str, beam: int, feats: Path, mode: str = "ngrams"):
    """The registry decoder ``name``; decoders that need a dictionary/LM get the dataset's;
    ``mode`` is the word beam search mode (ignored by the other decoders)."""
    return get_decoder(name, beam=beam, features=feats, mode=mode if name == "wordbeam" else None)


def decoder_label(name: str, mode: str = "ngrams") -> str:
    """The decoder as results record it: ``wordbeam`` in its default NGrams mode, else
    ``wordbeam:MODE``, so rows of different modes never overwrite each other."""
    return f"{name}:{mode}" if name == "wordbeam" and mode != "ngrams" else name


@torch.no_grad()
def evaluate(model: torch.nn.Module, feats: Path, split: str, loader_cfg: LoaderConfig, device: torch.device,
             decoder: str = "greedy", beam: int = 1, workers: int = 0, precision: str = "fp32",
             keep_pairs: int = 0, mode: str = "ngrams") -> dict:
    """Loss, every declared metric (speechperf/metric.py: WER, CER standard and paper, ...) and seconds
    of one pass over ``split``; ``NAME_lo``, ``NAME_hi``: the 95% bootstrap interval of each
    counted metric over the split's utterances (metrics/bootstrap.py), the resolution this split
    gives them."""
    start = time.perf_counter()
    beam = 1 if decoder == "greedy" else beam
    was_training = model.training
    model.eval()
    dec = make_decoder(decoder, beam, feats, mode)
    index = load_index(feats, [split])
    refs: list[str] = []
    hyps: list[str] = []
    loss_sum, n_loss = 0.0, 0
    for batch in make_loader(feats, split, eval_loader(loader_cfg, len(index.keys)), epoch=0, seed=0, index=index):
        with autocast(device, precision):
            log_probs, out_lens = planned_forward(model, batch.feats, batch.feat_lens, device)  # out_lens on the CPU
        log_probs = log_probs.float()  # (T', B, C)
        losses = F.ctc_loss(log_probs, batch.labels.to(device), out_lens, batch.label_lens,
                            blank=0, reduction="none", zero_infinity=False)
        finite = torch.isfinite(losses)
        loss_sum += float(losses[finite].sum())
        n_loss += int(finite.sum())
        hyps += dec.decode_batch(log_probs.cpu().numpy(), out_lens.numpy(), workers=workers)
        refs += list(batch.transcripts)
    if was_training:
        model.train()
    rates = error_rates(refs, hyps).to_dict()  # jiwer's WER and the CERs; the counted metrics' values and intervals:
    counted = error_intervals(utterance_errors(refs, hyps))  # the declared ones (speechperf/metric.py)
    return {
        "split": split, "decoder": decoder_label(decoder, mode), "beam": beam,
        "loss": loss_sum / max(n_loss, 1), **rates, **{k: v for k, v in counted.items() if k not in rates},
        "eval_s": time.perf_counter() - start,
        "pairs": [{"ref": r, "hyp": h} for r, h in zip(refs[:keep_pairs], hyps[:keep_pairs])],
    }


def eval_loader(cfg: LoaderConfig, shards: int) -> LoaderConfig:
    """The training loader's settings for a pass over a split of ``shards`` shards: in order
    (no shuffle, SortaGrad or paper padding), and with several readers, windows small enough
    that every reader gets some where the split has a shard per reader (readers own whole
    windows: a dev split of 43 shards inside one 128-shard window was one reader's work).
    One reader: the training windows, unchanged."""
    window = cfg.bucket_window if cfg.readers <= 1 else min(cfg.bucket_window, max(1, shards // cfg.readers))
    return replace(cfg, shuffle=False, mode="bucket", sort_first_epoch=False, bucket_window=window)


def _load_run_model(run, data: Path | None = None):
    """(model with the run's latest weights, RunConfig, features folder, the open Run)."""
    r = run if not isinstance(run, (str, Path)) else Run.open(Path(run), data=data)
    feats = r.features()  # a missing features folder fails before the checkpoint is read
    ckpt = r.load_checkpoint()
    cfg = RunConfig.from_dict(ckpt["config"])
    if cfg.loader.normalize:  # weights trained under one normalization are evaluated under it

        check_trained_on(feats, r.stats_sha256, r.folder)
    model = build_model(cfg.model)
    model.load_state_dict(ckpt["model"])
    return model, cfg, feats, r


def evaluate_run(run: Path, split: str = "dev-clean", decoder: str = "wordbeam", beam: int = 256,
                 workers: int = 0, mode: str = "ngrams", data: Path | None = None) -> dict:
    """``speechperf eval``: the run's latest checkpoint on ``split``; one row. ``data``: the
    features folder, where it is not where the run recorded it (another machine)."""
    model, cfg, feats, _ = _load_run_model(Path(run), data)
    r = evaluate(model, feats, split, cfg.loader, torch.device("cpu"), decoder=decoder, beam=beam, workers=workers,
                 mode=mode)
    return {k: v for k, v in r.items() if k != "pairs"}


def beam_sweep(run: Path, widths: list[int], split: str = "dev-clean", decoder: str = "wordbeam",
               workers: int = 0, mode: str = "ngrams", data: Path | None = None,
               db_path: Path | None = None) -> list[dict]:
    """Table 3 form: evaluation seconds, WER and CER per beam width; rows also go to the run's
    database (and to ``db_path``, a shared one, if given)."""
    rows = []
    with Run.open(Path(run), data=data, shared_db=db_path, write=True) as r:
        model, cfg, feats, _ = _load_run_model(r)
        for width in widths:
            e = evaluate(model, feats, split, cfg.loader, torch.device("cpu"), decoder=decoder, beam=width,
                         workers=workers, mode=mode)
            row = {"run_id": r.run_id, "split": split, "decoder": e["decoder"], "beam": e["beam"], "eval_s": e["eval_s"],
                   "wer": e["wer"], "cer": e["cer"], "cer_paper": e["cer_paper"], "n_utts": e["n_utts"], "device": "cpu"}
            r.upsert("beam_sweep", row)
            rows.append(row)
    return rows
