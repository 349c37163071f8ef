"""The transducer (RNN-T, Graves 2012): the objective of models whose ``forward`` returns
encoder frames ``(B, T', J)``; a prediction network reads the labels so far and a joint network
scores every (frame, label position) pair, ``(B, T', U+1, V)``, which the RNN-T loss
(``objectives/rnnt_loss.py``) sums over every alignment.

What it costs unlike CTC: the joint's tensor grows with frames x labels x vocabulary, so memory
and memory bandwidth set the step as much as GEMM rate. The joint runs in the step's precision
(autocast) and the loss fuses its log-softmax with the gradient (one buffer the joint's size).

The model's half of the contract (``models/rnnt.py``): ``predict(targets (B, U)) -> (g (B,
U+1, J), state)``, ``joint(enc (B, T', 1, J), g (B, 1, U+1, J)) -> logits (B, T', U+1, V)``; its
decoding (``objectives/transducer_search.py``): batched greedy on the device, and a beam search.
Every alignment of a standard transducer emits any number of labels per frame, so an utterance
is impossible only without frames.
"""
from __future__ import annotations

import time

import numpy as np
import psutil
import torch

from speechperf.corpus import alphabet
from speechperf.errors import ConfigError
from speechperf.models.contract import autocast, to_device, unwrap
from speechperf.objectives import register_objective
from speechperf.objectives.ctc import ctc_losses, needed_frames
from speechperf.objectives.rnnt_loss import joint_bytes
from speechperf.objectives.tdt import decode, head_loss, impossible as impossible_count
from speechperf.telemetry.device_gpus import cuda_free_bytes


def padded_targets(labels: torch.Tensor, label_lens: torch.Tensor, device: torch.device) -> torch.Tensor:
    """(sum L,) concatenated labels (any device) with CPU lengths (B,) -> (B, U) long on ``device``,
    padded with the blank (0); the gather index is made on the host, so a device's labels are never read."""
    lens = label_lens.to(torch.int64)
    width = max(int(lens.max()) if len(lens) else 0, 1)
    starts = torch.cumsum(lens, 0) - lens  # (B,)
    pos = torch.arange(width).unsqueeze(0)  # (1, U)
    inside = pos < lens.unsqueeze(1)  # (B, U)
    index = torch.where(inside, starts.unsqueeze(1) + pos, 0)  # (B, U): padding reads label 0, then masked
    flat = labels if labels.numel() else torch.zeros(1, dtype=torch.int64)
    picked = to_device(flat, device).long()[to_device(index, device)]
    return torch.where(to_device(inside, device), picked, 0)


@register_objective("transducer")
class Transducer:
    """RNN-T over the model's encoder frames, prediction network and joint network."""

    name = "transducer"
    decoders = ("greedy", "beam")
    label_terms = True  # its FLOPs grow with the labels: the prediction network, the joint (hardware/mfu.py)

    def losses(self, model, out, out_lens, labels, label_lens, device, precision: str) -> torch.Tensor:
        """(B,) per-utterance negative log-likelihoods (inf for an utterance without frames)."""
        core = unwrap(model)
        targets = padded_targets(labels, label_lens, device)  # (B, U)
        with autocast(device, precision):
            g, _ = core.predict(targets)  # (B, U+1, J)
            logits = core.joint(out.unsqueeze(2), g.unsqueeze(1))  # (B, T', 1, J) + (B, 1, U+1, J) -> (B, T', U+1, V)
        # lengths stay on the CPU: the loss checks them there and sends them to the device without waiting
        return head_loss(core, logits, targets.int(), out_lens.int(), label_lens.int())  # RNN-T, or TDT (durations)

    def train_loss(self, model, out, out_lens, batch, device, tc) -> tuple[torch.Tensor, int]:
        """The batch's mean RNN-T loss over its possible utterances; with the model's auxiliary CTC
        head (``model.ctc_weight`` w > 0), (1 - w) x that + w x the head's mean CTC loss (NeMo's hybrid
        RNNT-CTC), the CTC's impossible utterances (too few frames) zeroed and left out of its mean."""
        impossible = impossible_count(unwrap(model), out_lens, batch.label_lens)  # CPU lengths: no device sync
        losses = self.losses(model, out, out_lens, batch.labels, batch.label_lens, device, tc.system.precision)
        losses = torch.where(torch.isfinite(losses), losses, 0.0)  # as CTC's zero_infinity; counted above
        loss = losses.sum() / max(len(out_lens) - impossible, 1)
        weight = unwrap(model).cfg.ctc_weight
        if weight > 0:
            aux = ctc_aux_loss(model, out, out_lens, batch, device, tc.system.precision, tc.system.ctc_kernel)
            loss = (1.0 - weight) * loss + weight * aux
        return loss, impossible

    def eval_losses(self, model, out, out_lens, labels, label_lens, device, precision: str,
                    ctc_kernel: str = "numba") -> torch.Tensor:
        return self.losses(model, out, out_lens, labels, label_lens, device, precision)

    def decode_ids(self, model, out, out_lens, decoder: str = "greedy", beam: int = 1) -> list[list[int]]:
        """Token ids per utterance (no blanks): batched greedy on the device, or the beam search."""
        core = unwrap(model)
        with torch.no_grad():
            return decode(core, out, out_lens, decoder, beam)  # a TDT's greedy search, or RNN-T's searches

    def texts(self, model, out, out_lens, count: int, units=None, decoder: str = "greedy", beam: int = 1) -> list[str]:
        decode = units.decode if units is not None else alphabet.decode
        n = min(count, len(out_lens))
        return [decode(ids) for ids in self.decode_ids(model, out[:n], out_lens[:n], decoder, beam)]

    def eval_submit(self, model, out, out_lens, pool, decoder: str, beam: int, units=None) -> torch.Tensor:
        """Decode the batch now (the search needs the model: it runs on the evaluation's device,
        not the pool's threads) and hand the texts to ``pool`` in order; keep the frames for the loss."""
        wall, cpu = time.perf_counter(), time.thread_time()
        texts = self.texts(model, out, out_lens, len(out_lens), units, decoder, beam)
        pool.done(texts, int(out_lens.sum()), time.perf_counter() - wall, time.thread_time() - cpu)
        return out

    def probe_loss(self, model, out, out_lens, label_lens=None) -> torch.Tensor:
        """The RNN-T loss of random labels (``label_lens``, default a quarter of each utterance's
        frames): the prediction network, the joint and the loss kernel all run (warm-up compiles them),
        and the auxiliary CTC head where the model has one."""
        core = unwrap(model)
        lens = label_lens if label_lens is not None else (out_lens // 4).clamp(min=1)
        classes = int(core.cfg.num_classes)
        labels = torch.randint(1, classes, (int(lens.sum()),))
        precision = "bf16" if out.dtype == torch.bfloat16 else "fp32"
        loss = self.losses(model, out, out_lens, labels, lens, out.device, precision).sum()
        if core.cfg.ctc_weight > 0:  # the step runs the auxiliary CTC head too: its FLOPs and warm-up
            with autocast(out.device, precision):
                loss = loss + core.ctc_log_probs(out).sum()
        return loss

    def synthetic_loss(self, model, out, out_lens, classes: int) -> torch.Tensor:
        return self.probe_loss(model, out, out_lens).float() / max(len(out_lens), 1)

    def warm_decode(self, decoder, classes: int, frames: int) -> None:
        """Nothing to compile apart from the model (its search is torch ops)."""

    def step_bytes(self, model, cfg, batching, index, units, dtype=torch.float32) -> tuple[int, int]:
        """(bytes, batch number) of the largest joint an epoch's batches make: the joint's
        (B, T', U+1, V) logits with the loss's gradient buffer (``rnnt_loss.joint_bytes``) and its
        hidden (B, T', U+1, J) sum and tanh, for epoch 1's plan on rank 0 (every epoch cuts the same
        sizes). U is bounded from the transcripts without encoding them: characters and separators
        for character units, characters and word starts for subword units."""
        core = unwrap(model)
        plan = batching.plan(index, epoch=1)
        chars = np.array([_label_bound(index.transcript(u), units) for u in range(len(index))], dtype=np.int64)
        item = torch.empty((), dtype=dtype).element_size()
        worst = (0, 0)
        for b, utts in enumerate(plan.batches):
            frames = int(core.output_lengths(torch.as_tensor(index.frames[utts]).long()).max())
            cells = len(utts) * frames * (int(chars[utts].max()) + 1)
            need = joint_bytes(len(utts), frames, int(chars[utts].max()) + 1, core.out.out_features, dtype) + \
                2 * cells * core.cfg.joint_dim * item
            worst = max(worst, (need, b))
        return worst

    def check_memory(self, model, cfg, batching, index, units, device: torch.device) -> None:
        """Refuse (ConfigError, exit 2, before the run folder exists) a run whose largest joint
        would not fit the device's free memory (a CPU's available memory), naming the gigabytes."""
        dtype = torch.float32 if cfg.train.system.precision == "fp32" else torch.bfloat16
        need, b = self.step_bytes(model, cfg, batching, index, units, dtype)
        free = cuda_free_bytes(device) if device.type == "cuda" else psutil.virtual_memory().available
        if need > free:
            raise ConfigError(f"the transducer's joint of batch {b} needs {need / 2**30:.1f} GB, above the "
                              f"{free / 2**30:.1f} GB free on {device}: lower loader.batch_size or "
                              "loader.max_duration, or model.joint_dim")


def ctc_aux_loss(model, out, out_lens, batch, device, precision: str, kernel: str = "numba") -> torch.Tensor:
    """The auxiliary CTC head's loss (objectives/ctc.py's, by ``kernel``, on ``model.ctc_log_probs(out)``,
    the head in the step's precision): summed over the utterances with enough frames for their labels,
    divided by their count."""
    with autocast(device, precision):
        log_probs = unwrap(model).ctc_log_probs(out)  # (T', B, V) float32
    valid = max(int((out_lens >= needed_frames(batch)).sum()), 1)  # CPU lengths: no device sync
    losses = ctc_losses(log_probs, to_device(batch.labels, device), out_lens, batch.label_lens, kernel,
                        zero_infinity=True)
    return losses.sum() / valid


def _label_bound(text: str, units) -> int:
    """At least the labels ``text`` encodes to: characters and separators (a doubled letter gets one),
    or for subword units characters and word starts."""
    if units is None or units.is_char:
        return len(text) + sum(a == b for a, b in zip(text, text[1:]))
    return len(text) + text.count(" ") + 1
