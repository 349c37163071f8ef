"""The attention encoder-decoder's objective (``aed``): label-smoothed cross-entropy of a
Transformer decoder trained by teacher forcing on the labels, over the encoder frames the model's
``forward`` returns ``(B, T', D)``; greedy (batched, on the device) and beam decoding.

Symbols (models/encdec.py): index 0, the blank that no label uses, is the decoder's start symbol
(BOS) and its end symbol (EOS). An utterance of U labels is read as ``0 y1..yU`` and scored on
``y1..yU 0``: U + 1 cross-entropies, summed per utterance (the loss per utterance, as the
transducer's negative log-likelihood; the step averages it over the batch's utterances).
Padding positions are ignored (``ignore_index``). Every utterance with at least one encoder frame
is possible; one without frames has an infinite loss (counted, never averaged in).

What it costs unlike CTC and the transducer: the decoder runs over the labels (its self-attention
grows with U^2, its cross-attention with T' x U), and decoding is autoregressive: one decoder pass
per emitted token (no key/value cache: each step recomputes the prefix).
"""
from __future__ import annotations

import math
import time

import numpy as np
import psutil
import torch
import torch.nn.functional as F

from speechperf.corpus import alphabet
from speechperf.errors import ConfigError
from speechperf.models.conformer import valid_frames
from speechperf.models.contract import autocast, to_device, unwrap
from speechperf.models.encdec import BOUNDARY
from speechperf.objectives import register_objective
from speechperf.objectives.transducer import _label_bound as label_bound, padded_targets
from speechperf.telemetry.device_gpus import cuda_free_bytes

IGNORE = -100  # target index of padding positions (F.cross_entropy's ignore_index)


def teacher_forcing(labels: torch.Tensor, label_lens: torch.Tensor, device: torch.device
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs (B, U+1): BOS then the labels, zero-padded; targets (B, U+1): the labels then EOS,
    IGNORE past it), on ``device`` from CPU lengths (no device read)."""
    padded = padded_targets(labels, label_lens, device)  # (B, U), 0 past each length
    inputs = F.pad(padded, (1, 0), value=BOUNDARY)  # (B, U+1)
    pos = torch.arange(inputs.shape[1])[None, :]  # (1, U+1)
    keep = to_device(pos <= label_lens.to(torch.int64)[:, None], device)  # labels and the EOS after them
    return inputs, torch.where(keep, F.pad(padded, (0, 1), value=BOUNDARY), IGNORE)  # position U_b holds 0 = EOS


def frame_mask(out_lens: torch.Tensor, frames: int, device: torch.device) -> torch.Tensor:
    """(B, T') True on valid encoder frames (an utterance without frames attends to its first, so
    its row stays finite: its loss is set infinite apart)."""
    return to_device(valid_frames(out_lens.clamp(min=1), frames), device)


@register_objective("aed")
class AttentionED:
    """Label-smoothed cross-entropy over the decoder's outputs; greedy and beam decoding."""

    name = "aed"
    decoders = ("greedy", "beam")
    label_terms = True  # its FLOPs grow with the labels: the decoder over U + 1 positions (hardware/mfu.py)
    label_squares = True  # and with U^2: the decoder's self-attention (mfu.FlopModel's f)

    def losses(self, model, out, out_lens, labels, label_lens, device, precision: str,
               smoothing: float | None = None) -> torch.Tensor:
        """(B,) per-utterance cross-entropy sums (inf for an utterance without frames)."""
        core = unwrap(model)
        inputs, targets = teacher_forcing(labels, label_lens, device)
        with autocast(device, precision):
            logits = core.decode(inputs, out, frame_mask(out_lens, out.shape[1], device))  # (B, U+1, V)
        ls = core.cfg.label_smoothing if smoothing is None else smoothing
        each = F.cross_entropy(logits.float().transpose(1, 2), targets, ignore_index=IGNORE, label_smoothing=ls,
                               reduction="none")  # (B, U+1), 0 at ignored positions
        none = to_device(out_lens < 1, device)
        return torch.where(none, math.inf, each.sum(1))

    def train_loss(self, model, out, out_lens, batch, device, tc) -> tuple[torch.Tensor, int]:
        impossible = int((out_lens < 1).sum())  # CPU lengths: no device sync
        losses = self.losses(model, out, out_lens, batch.labels, batch.label_lens, device, tc.system.precision)
        losses = torch.where(torch.isfinite(losses), losses, 0.0)
        return losses.sum() / max(len(out_lens) - impossible, 1), impossible

    def eval_losses(self, model, out, out_lens, labels, label_lens, device, precision: str,
                    ctc_kernel: str = "numba") -> torch.Tensor:
        return self.losses(model, out, out_lens, labels, label_lens, device, precision)

    def decode_ids(self, model, out, out_lens, decoder: str = "greedy", beam: int = 1) -> list[list[int]]:
        """Token ids per utterance (no BOS/EOS): batched greedy on the device, or the beam search."""
        core = unwrap(model)
        with torch.no_grad():
            if decoder == "greedy" or beam <= 1:
                return greedy_batch(core, out, out_lens)
            return [beam_search(core, out[b: b + 1, : max(int(out_lens[b]), 1)], beam) for b in range(len(out_lens))]

    def texts(self, model, out, out_lens, count: int, units=None, decoder: str = "greedy", beam: int = 1) -> list[str]:
        decode = units.decode if units is not None else alphabet.decode
        n = min(count, len(out_lens))
        return [decode(ids) for ids in self.decode_ids(model, out[:n], out_lens[:n], decoder, beam)]

    def eval_submit(self, model, out, out_lens, pool, decoder: str, beam: int, units=None) -> torch.Tensor:
        """Decode the batch now (the search is the model's, on the evaluation's device) and hand the
        texts to ``pool`` in order; keep the frames for the loss."""
        wall, cpu = time.perf_counter(), time.thread_time()
        texts = self.texts(model, out, out_lens, len(out_lens), units, decoder, beam)
        pool.done(texts, int(out_lens.sum()), time.perf_counter() - wall, time.thread_time() - cpu)
        return out

    def probe_loss(self, model, out, out_lens, label_lens=None) -> torch.Tensor:
        """The loss of random labels (``label_lens``, default a quarter of each utterance's frames):
        the whole decoder runs (warm-up compiles it; the FLOP count counts it)."""
        lens = label_lens if label_lens is not None else (out_lens // 4).clamp(min=1)
        labels = torch.randint(1, int(unwrap(model).cfg.num_classes), (int(lens.sum()),))
        precision = "bf16" if out.dtype == torch.bfloat16 else "fp32"
        return self.losses(model, out, out_lens, labels, lens, out.device, precision).sum()

    def synthetic_loss(self, model, out, out_lens, classes: int) -> torch.Tensor:
        return self.probe_loss(model, out, out_lens).float() / max(len(out_lens), 1)

    def warm_decode(self, decoder, classes: int, frames: int) -> None:
        """Nothing to compile apart from the model (its search is torch ops)."""

    def step_bytes(self, model, cfg, batching, index, units, dtype=torch.float32) -> tuple[int, int]:
        """(bytes, batch number) of the largest output an epoch's batches make: the decoder's
        (B, U+1, V) logits, their fp32 copy, the log-softmax and its gradient (4 tensors), U bounded
        from the transcripts as the transducer bounds it (``transducer._label_bound``)."""
        plan = batching.plan(index, epoch=1)
        bound = np.array([label_bound(index.transcript(u), units) for u in range(len(index))], dtype=np.int64)
        item = torch.empty((), dtype=dtype).element_size()
        classes = unwrap(model).cfg.num_classes
        worst = (0, 0)
        for b, utts in enumerate(plan.batches):
            cells = len(utts) * (int(bound[utts].max()) + 1) * classes
            worst = max(worst, (cells * (item + 3 * 4), b))
        return worst

    def check_memory(self, model, cfg, batching, index, units, device: torch.device) -> None:
        """Refuse (ConfigError, exit 2, before the run folder exists) a run whose largest output
        would not fit the device's free memory, naming the gigabytes."""
        dtype = torch.float32 if cfg.train.system.precision == "fp32" else torch.bfloat16
        need, b = self.step_bytes(model, cfg, batching, index, units, dtype)
        free = cuda_free_bytes(device) if device.type == "cuda" else psutil.virtual_memory().available
        if need > free:
            raise ConfigError(f"the decoder's outputs of batch {b} need {need / 2**30:.1f} GB, above the "
                              f"{free / 2**30:.1f} GB free on {device}: lower loader.batch_size or loader.max_duration")


def max_tokens(cfg, frames: int) -> int:
    """The most tokens decoded for an utterance of ``frames`` encoder frames (EOS included)."""
    return int(math.ceil(cfg.decode_ratio * frames)) + 1


def greedy_batch(core, enc: torch.Tensor, out_lens: torch.Tensor) -> list[list[int]]:
    """The most likely token at each step, every utterance of the batch at once on ``enc``'s device,
    until each has emitted EOS or its ``max_tokens``; one host read per step (all done?)."""
    b, t = enc.shape[0], enc.shape[1]
    device = enc.device
    valid = frame_mask(out_lens, t, device)
    limit = torch.tensor([max_tokens(core.cfg, int(n)) for n in out_lens])  # (B,) CPU
    tokens = torch.full((b, 1), BOUNDARY, dtype=torch.long, device=device)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    for step in range(int(limit.max()) if b else 0):
        nxt = core.decode(tokens, enc, valid)[:, -1].argmax(-1)  # (B,)
        nxt = torch.where(done, BOUNDARY, nxt)
        tokens = torch.cat((tokens, nxt[:, None]), dim=1)
        done = done | (nxt == BOUNDARY) | to_device(limit <= step + 1, device)
        if bool(done.all()):
            break
    rows = tokens[:, 1:].cpu().tolist()
    return [row[: row.index(BOUNDARY)] if BOUNDARY in row else row for row in rows]


def beam_search(core, enc: torch.Tensor, beam: int) -> list[int]:
    """Beam search over one utterance's frames ``enc`` (1, T', D): ``beam`` hypotheses extended
    together each step; a hypothesis ending in EOS is finished, scored by its log-probability over
    its length (tokens with EOS) to the power ``length_penalty``; the search stops once ``beam``
    are finished or at ``max_tokens`` (the unfinished then scored as they are). The best's tokens."""
    cfg, device = core.cfg, enc.device
    valid = torch.ones(1, enc.shape[1], dtype=torch.bool, device=device)
    hyps = torch.full((1, 1), BOUNDARY, dtype=torch.long, device=device)  # (K, 1 + step)
    scores = torch.zeros(1, device=device)  # (K,)
    finished: list[tuple[float, list[int]]] = []
    limit = max_tokens(cfg, enc.shape[1])
    for step in range(1, limit + 1):
        k = hyps.shape[0]
        logp = core.decode(hyps, enc.expand(k, -1, -1), valid.expand(k, -1))[:, -1].float().log_softmax(-1)
        top, idx = (scores[:, None] + logp).flatten().topk(min(2 * beam, logp.numel()))  # enough to refill
        keep = []
        for s, i in zip(top.tolist(), idx.tolist()):
            h, v = divmod(i, logp.shape[1])
            if v == BOUNDARY:
                finished.append((s / step ** cfg.length_penalty, hyps[h, 1:].tolist()))
            else:
                keep.append((h, v, s))
            if len(keep) == beam:
                break
        if len(finished) >= beam or not keep:
            break
        if step == limit:  # unfinished at the limit: scored over their tokens so far
            finished += [(s / step ** cfg.length_penalty, hyps[h, 1:].tolist() + [v]) for h, v, s in keep]
            break
        rows = torch.tensor([h for h, _, _ in keep], device=device)
        hyps = torch.cat((hyps[rows], torch.tensor([[v] for _, v, _ in keep], device=device)), dim=1)
        scores = torch.tensor([s for _, _, s in keep], device=device)
    return max(finished, key=lambda f: f[0])[1]
