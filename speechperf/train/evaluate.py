"""Evaluation of an acoustic model on a prepared split: CTC loss and every declared metric.

The per-epoch evaluation of the training loop and ``speechperf eval``/``beam-sweep``
(studies/evaluate_run.py) share :func:`evaluate`; the model stays resident in the training
process (no swapping to disk), and the seconds spent here are recorded apart from training time.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from speechperf.config import ConfigError
from speechperf.data.batching import Batching
from speechperf.scoring.bootstrap import error_intervals
from speechperf.scoring.error_rates import UtteranceErrors, scored
from speechperf.metric import METRICS
from speechperf.models.contract import autocast, planned_forward
from speechperf.objectives import OBJECTIVES, objective_of
from speechperf.objectives.ctc import host_copy  # noqa: F401 (evaluation's name for it, as before)
from speechperf.data.index import Index
from speechperf.data.loader import Batch, Loader, load_index, make_loader
from speechperf.data.units import Units, load_units
from speechperf.decode import get_decoder
from speechperf.decode.batch import DecodePool, auto_threads
from speechperf.data.lm import LM_NAME


# Decoders built so far, by (name, beam, mode, features folder, LM file state): the run's
# initialization builds the evaluation's decoder once (train/warmup.py) and every epoch reuses
# it, its dictionary and LM tables included; a rebuilt lm.json is a new key. A few entries:
# a beam sweep builds one per width, a run two (the epochs' beam and the final one).
_DECODERS: dict[tuple, object] = {}
_DECODERS_KEPT = 8


def _decoder_key(name: str, beam: int, feats: Path | None, mode: str) -> tuple:
    lm = Path(feats) / LM_NAME if feats is not None else None
    try:
        state = (lm.stat().st_mtime_ns, lm.stat().st_size) if lm is not None else None
    except OSError:  # not built yet: the decoder's factory builds it
        state = None
    return name, beam, mode, str(Path(feats).resolve()) if feats is not None else None, state


def make_decoder(name: str, beam: int, feats: Path, mode: str = "ngrams", units: Units | None = None):
    """The registry decoder ``name``; decoders that need a dictionary/LM get the dataset's;
    ``mode`` is the word beam search mode (ignored by the other decoders); ``units`` the run's
    output units (None: characters). Built once per (name, beam, mode, features, LM file, units):
    later calls return the same decoder."""
    mode = mode if name == "wordbeam" else "ngrams"
    unit_key = units.name if units is not None else "char"
    dec = _DECODERS.get((*_decoder_key(name, beam, feats, mode), unit_key))
    if dec is None:
        dec = get_decoder(name, beam=beam, features=feats, mode=mode if name == "wordbeam" else None, units=units)
        while len(_DECODERS) >= _DECODERS_KEPT:
            del _DECODERS[next(iter(_DECODERS))]  # the oldest
        # keyed after the build: it may write lm.json
        _DECODERS[(*_decoder_key(name, beam, feats, mode), unit_key)] = dec
    return dec


def decoder_label(name: str, mode: str = "ngrams") -> str:
    """The decoder as results record it: ``wordbeam`` in its default NGrams mode, else
    ``wordbeam:MODE``, so rows of different modes never overwrite each other."""
    return f"{name}:{mode}" if name == "wordbeam" and mode != "ngrams" else name


@torch.no_grad()
def evaluate(model: torch.nn.Module, feats: Path, split: str, batching: Batching, device: torch.device,
             decoder: str = "greedy", beam: int = 1, workers: int = 0, precision: str = "fp32",
             keep_pairs: int = 0, mode: str = "ngrams", intervals: bool = True, units=None,
             ctc_kernel: str = "numba") -> dict:  # the CTC loss's kernel (train.system.ctc_kernel)
    """Loss, every declared metric (speechperf/metric.py: WER, CER standard and paper, ...) and seconds
    of one pass over ``split`` in the batches ``batching.for_eval`` cuts; ``NAME_lo``, ``NAME_hi``:
    the 95% bootstrap interval of each counted metric over the split's utterances
    (scoring/bootstrap.py), the resolution this split gives them; scored, and the first
    ``keep_pairs`` pairs kept, in utterance-id order (:func:`by_id`). ``intervals`` False: the point
    values only, and ``errors``, the per-utterance counts :func:`with_intervals` turns into the
    intervals later (the training loop computes them off the TTA clock).

    ``workers``: decode threads (0: :func:`decode_threads`); each batch's decode runs on them
    while the next batches' forward passes run. The batch loop reads no device value: on a GPU
    it queues forward passes and log-prob copies (:func:`host_copy`) without waiting, and the
    losses are computed and read after it (:func:`mean_loss`). Seconds: ``eval_forward_s`` (the
    pass over the batches: loading, forward, loss, up to the losses read back), ``eval_decode_s``
    (waiting for the decodes after that), ``eval_score_s`` (scoring); they sum to ``eval_s``.
    How the decodes ran (:data:`speechperf.results.schema.EVALS_DECODE`): ``decode_threads``,
    ``decode_frames`` (valid frames), ``decode_busy_s`` (thread-seconds inside the decoder) and
    ``decode_cpu_s`` (their CPU seconds: less where the threads waited for a core or the GIL). The batches
    are the split's resident ones where :func:`keep_resident` kept them for this device (``eval_data``:
    where), else read from the shards now (``stream``): the same ones in the same order."""
    start = time.perf_counter()
    beam = 1 if decoder == "greedy" else beam
    was_training = model.training
    model.eval()
    objective, units = objective_of(model), units if units is not None else load_units(feats, batching.loader.units)
    check_decoder(objective, decoder)
    dec = make_decoder(decoder, beam, feats, mode, units) if objective.name == "ctc" else None  # CTC's: built once
    index = load_index(feats, [split])
    kept = _RESIDENT.get(_resident_key(feats, split, index, batching, device))
    batches = kept.batches if kept is not None else eval_batches(feats, split, batching, index)
    search = Search(objective, decoder, beam, units, ctc_kernel)
    with DecodePool(dec, workers or decode_threads(batching)) as pool, _closing(batches):
        loss, refs, ids = _forward(model, batches, device, precision, pool, search)
        forward_end = time.perf_counter()
        hyps = pool.results()
        decoding = {"decode_threads": pool.threads, "decode_frames": pool.frames, "decode_busy_s": pool.busy_s,
                    "decode_cpu_s": pool.cpu_s}
    if was_training:
        model.train()
    decoded = time.perf_counter()
    refs, hyps = by_id(ids, refs, hyps)
    scores = score(refs, hyps, intervals)
    end = time.perf_counter()
    return {"split": split, "decoder": decoder_label(decoder, mode), "beam": beam, "loss": loss, **scores,
            "eval_s": end - start, "eval_forward_s": forward_end - start, "eval_decode_s": decoded - forward_end,
            "eval_score_s": end - decoded, **decoding, "eval_data": kept.where if kept is not None else "stream",
            "pairs": [{"ref": r, "hyp": h} for r, h in zip(refs[:keep_pairs], hyps[:keep_pairs])]}


@dataclass(frozen=True)
class Search:
    """How an evaluation turns outputs into text and a loss: the model's objective, the decoder's name
    and width, the run's output units (None: characters) and the CTC loss's kernel."""

    objective: object
    decoder: str
    beam: int
    units: object = None
    ctc_kernel: str = "numba"  # train.system.ctc_kernel


def check_decoder(objective, decoder: str) -> None:
    """Refuse a decoder the model's objective cannot decode with (CTC's word beam search on a transducer)."""
    if decoder not in objective.decoders:
        raise ConfigError(f"decoder {decoder!r} cannot decode a {objective.name} model; its decoders: "
                          f"{', '.join(objective.decoders)}")


def _forward(model: torch.nn.Module, batches, device: torch.device, precision: str,
                  pool: DecodePool, search: Search) -> tuple[float, list[str], list[str]]:
    """Every batch's forward pass, its outputs handed to ``pool`` as they leave the model (CTC: the
    pool's threads decode them beside the next forward passes); then the mean loss (CTC: the pass's
    only device reads, after its loop). (loss, references, ids) in batch order."""
    refs: list[str] = []
    ids: list[str] = []
    outputs: list[tuple] = []  # per batch: what its loss needs, read after the loop
    obj = search.objective
    for batch in batches:  # CTC: launches only, no read of a device value in here
        with autocast(device, precision):
            out, out_lens = planned_forward(model, batch.feats, batch.feat_lens, device)  # out_lens on the CPU
        kept = obj.eval_submit(model, out, out_lens, pool, search.decoder, search.beam, search.units)
        outputs.append((kept, batch.labels, out_lens, batch.label_lens))
        refs += list(batch.transcripts)
        ids += list(batch.ids)
    # the device's outputs freed on return: the decodes read copies
    return mean_loss(outputs, device, model, precision, search.ctc_kernel), refs, ids


def by_id(ids: list[str], refs: list[str], hyps: list[str]) -> tuple[list[str], list[str]]:
    """The (reference, hypothesis) pairs in the split's utterance-id order: the bootstrap draws
    utterances by position and the kept pairs are the first ones, so scoring in this order makes
    both a function of the split and the model alone, whatever the batches' size and order."""
    order = sorted(range(len(ids)), key=ids.__getitem__)
    return [refs[i] for i in order], [hyps[i] for i in order]


def mean_loss(outputs: list[tuple], device: torch.device, model: torch.nn.Module | None = None,
              precision: str = "fp32", ctc_kernel: str = "numba") -> float:
    """The model's objective's loss averaged over the utterances where it is finite, from each
    batch's ``(output, labels, out_lens, label_lens)`` in order: the evaluation's only device reads,
    all after its batch loop. CUDA's CTC copies its length lists with blocking copies (a wait
    for the stream), so the losses are computed here too, after every forward pass is queued."""
    objective = objective_of(model) if model is not None else OBJECTIVES.lookup("ctc")  # None: CTC log-probs
    loss_sum, n_loss = 0.0, 0
    for out, labels, out_lens, label_lens in outputs:
        losses = objective.eval_losses(model, out, out_lens, labels, label_lens, device, precision, ctc_kernel)  # (B,)
        finite = torch.isfinite(losses)
        loss_sum += float(losses[finite].sum())
        n_loss += int(finite.sum())
    return loss_sum / max(n_loss, 1)


@contextmanager
def _closing(batches):
    """A streamed split's loader closed however its pass ends (a second stop signal raises inside it):
    its readers never outlive the evaluation; kept batches (a list) need nothing."""
    try:
        yield batches
    finally:
        if isinstance(batches, Loader):
            batches.close()


def eval_batches(feats: Path, split: str, batching: Batching, index: Index | None = None):
    """The evaluation's batches of ``split``, read from its shards: in order, the same every time."""
    index = index if index is not None else load_index(feats, [split])
    return make_loader(feats, split, batching.for_eval(index), epoch=0, seed=0, index=index)


# The evaluation split's batches, kept between evaluations: one entry, keyed by (features folder,
# split, its shards' hashes, normalization statistics file, loader settings, device). A re-prepared
# split or other settings are a new key, streamed until kept again.
_RESIDENT: dict[tuple, "Resident"] = {}
# Of the GPU memory free when the batches are placed (after the model's warm-up pass), the share
# they may take: the rest is the training steps' activations, which grow with the batch size.
DEVICE_SHARE = 0.25


@dataclass
class Resident:
    """A split's evaluation batches, built once: features and labels on the device (``device``)
    or in host memory (``pinned`` for a CUDA device, else ``host``), lengths on the CPU."""

    where: str
    nbytes: int  # the padded features' bytes
    batches: list[Batch]


def _resident_key(feats: Path, split: str, index: Index, batching: Batching, device) -> tuple:
    stats = Path(feats) / "stats.json"
    state = (stats.stat().st_mtime_ns, stats.stat().st_size) if stats.exists() else None
    # the loader settings alone: the evaluation's batches depend on neither the seed nor the processes
    return str(Path(feats).resolve()), split, tuple(index.shas), state, batching.loader, str(torch.device(device))


def padded_bytes(first: Batch, plan_lens: list[list[int]]) -> int:
    """Bytes of every planned batch's padded float32 features, from the first batch's width."""
    dim = first.feats.shape[2]
    return 4 * dim * sum(len(lens) * max(lens) for lens in plan_lens)


def keep_resident(feats: Path, split: str, batching: Batching, device, max_mb: float) -> Resident | None:
    """Build ``split``'s evaluation batches once and keep them for every later :func:`evaluate`
    on ``device``: on a CUDA device when they take at most ``DEVICE_SHARE`` of its free memory,
    else pinned there (host memory on a CPU). None, keeping nothing, when their padded features
    exceed ``max_mb`` MiB (or ``max_mb`` is 0): the evaluations read the shards each time."""
    device = torch.device(device)
    _RESIDENT.clear()  # one split kept: a new one replaces the old
    if max_mb <= 0:
        return None
    index = load_index(feats, [split])
    loader = eval_batches(feats, split, batching, index)
    plan_lens = [index.frames[b].tolist() for b in loader.plan.batches]
    batches: list[Batch] = []
    where = nbytes = None
    for batch in loader:
        if where is None:
            nbytes = padded_bytes(batch, plan_lens)
            if nbytes > max_mb * 2**20:
                return None  # the readers stop with the loader
            where = _placement(nbytes, device)
        batches.append(_placed(batch, where, device))
    kept = Resident(where or "host", nbytes or 0, batches)
    _RESIDENT[_resident_key(feats, split, index, batching, device)] = kept
    return kept


def resident_shapes() -> set[tuple[int, int]]:
    """The (utterances, frames) shapes of the kept evaluation batches (none kept: empty)."""
    return {tuple(b.feats.shape[:2]) for kept in _RESIDENT.values() for b in kept.batches}


def release_resident() -> None:
    """Drop the kept batches (their device or pinned memory is freed with them)."""
    _RESIDENT.clear()


def _placement(nbytes: int, device: torch.device) -> str:
    if device.type != "cuda":
        return "host"
    free, _ = torch.cuda.mem_get_info(device)
    return "device" if nbytes <= DEVICE_SHARE * free else "pinned"


def _placed(batch: Batch, where: str, device: torch.device) -> Batch:
    """``batch``'s features and labels where they are kept; a reader's shared-memory tensor is
    copied out (one file handle per kept batch would stay open otherwise)."""
    if where == "device":
        move = lambda x: x.to(device)  # noqa: E731
    elif where == "pinned":
        move = lambda x: x.pin_memory()  # noqa: E731
    else:
        move = lambda x: x.clone() if x.is_shared() else x  # noqa: E731
    return replace(batch, feats=move(batch.feats), labels=move(batch.labels), reads=())


def decode_threads(batching: Batching) -> int:
    """Decode threads of an evaluation that names none: every CPU this process may use less
    the loader's reader processes (:func:`speechperf.decode.batch.auto_threads`)."""
    return auto_threads(batching.loader.readers)


def score(refs: list[str], hyps: list[str], intervals: bool = True) -> dict:
    """The WER (jiwer's, summed from the per-utterance counts) and the CERs, the counted metrics'
    values (speechperf/metric.py) and, with ``intervals``, their 95% bootstrap intervals; without,
    ``errors``: the per-utterance counts :func:`with_intervals` reads."""
    found, errors = scored(refs, hyps)  # one pass of edit distances: the rates are the counts' sums
    rates = found.to_dict()
    if intervals:
        return {**rates, **{k: v for k, v in error_intervals(errors).items() if k not in rates}}
    return {**rates, **{k: v for k, v in point_values(errors).items() if k not in rates}, "errors": errors}


def point_values(u: UtteranceErrors) -> dict[str, float]:
    """Every counted metric's value, exactly as :func:`error_intervals` computes it (without its
    resamples): 100 x the errors' sum / the lengths' sum."""
    out = {}
    for m in METRICS.values():
        if m.counts is not None:
            errors, lengths = (np.asarray(getattr(u, c), dtype=np.int64) for c in m.counts)
            out[m.name] = 100.0 * float(errors.sum()) / float(lengths.sum())
    return out


def with_intervals(r: dict) -> dict:
    """An evaluation made with ``intervals=False``, completed: its ``errors`` become every
    counted metric's ``NAME_lo``, ``NAME_hi`` (the same as ``intervals=True`` gives)."""
    if "errors" not in r:
        raise ValueError(f"evaluation of {r.get('split')!r} holds no per-utterance errors to resample")
    rest = {k: v for k, v in r.items() if k != "errors"}
    found = error_intervals(r["errors"])
    return {**rest, **{k: v for k, v in found.items() if k.endswith(("_lo", "_hi")) or k not in rest}}
