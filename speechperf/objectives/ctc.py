"""CTC (Graves et al. 2006): the objective of DS2, the Conformer-CTC and every model whose
``forward`` returns log-probabilities ``(T', B, C)``; the loss is :func:`ctc_losses`: on a CPU
speechperf's kernel (objectives/ctc_cpu.py, ``train.system.ctc_kernel=numba``, the default), on a
GPU or with ``ctc_kernel=torch`` torch's ``F.ctc_loss``.

An alignment of a label sequence exists iff its utterance has at least as many output frames
as the sequence needs: its length, plus one blank between each pair of equal neighbours. The
character units never repeat a symbol (the separator splits doubles), so they need their
length; subword units may repeat, and the loader then gives each batch's needs (``ctc_frames``,
host arithmetic). An utterance without an alignment has an infinite loss: it is zeroed and
counted, never averaged in. This module is the code the step, the evaluation, the warm-up, the
FLOP count and ``bench zoo`` ran before objectives had names, moved here unchanged (the
reference curves reproduce bit for bit; a reproduction trains with its curve's CTC kernel).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from speechperf.corpus import alphabet
from speechperf.decode.batch import Pending
from speechperf.models.contract import to_device
from speechperf.objectives import ctc_cpu, register_objective


def needed_frames(batch) -> torch.Tensor:
    """(B,) CPU: the output frames each utterance's labels need (``batch.ctc_frames`` where the
    loader gives them, else the label lengths: units that never repeat a symbol)."""
    frames = getattr(batch, "ctc_frames", None)
    return batch.label_lens if frames is None else frames


@register_objective("ctc")
class CTC:
    """Connectionist temporal classification over the model's log-probabilities."""

    name = "ctc"
    decoders = ("greedy", "beam", "wordbeam", "flashlight")
    label_terms = False  # its FLOPs do not depend on the labels (the loss is not counted)

    def train_loss(self, model, out, out_lens, batch, device, tc) -> tuple[torch.Tensor, int]:
        log_probs = out.float()  # (T', B, C): CTC in fp32 whatever the autocast dtype
        impossible = int((out_lens < needed_frames(batch)).sum())  # CPU tensors: no device sync
        valid = max(len(out_lens) - impossible, 1)
        if tc.system.deterministic and device.type == "cuda":
            # CUDA's CTC backward accumulates with atomics and has no deterministic variant: the
            # CPU's is exact (the cost of determinism: a transfer and the CPU's CTC per step)
            losses = ctc_losses(log_probs.cpu(), batch.labels, out_lens, batch.label_lens, tc.system.ctc_kernel,
                                zero_infinity=True)
            return (losses.sum() / valid).to(device), impossible
        labels = to_device(batch.labels, device)
        # lengths stay on the CPU: F.ctc_loss wants them there, a device copy would be read back
        losses = ctc_losses(log_probs, labels, out_lens, batch.label_lens, tc.system.ctc_kernel, zero_infinity=True)
        return losses.sum() / valid, impossible

    def eval_submit(self, model, out, out_lens, pool, decoder: str, beam: int, units=None) -> torch.Tensor:
        """Hand the batch's log-probabilities to ``pool``, whose threads decode them beside the next
        forward passes; returns what the loss needs (the fp32 log-probabilities)."""
        log_probs = out.float()  # (T', B, C)
        pool.submit(host_copy(log_probs), out_lens.numpy())
        return log_probs

    def eval_losses(self, model, out, out_lens, labels, label_lens, device, precision: str,
                    ctc_kernel: str = "numba") -> torch.Tensor:
        """(B,) the evaluation's per-utterance losses (inf where impossible: left out of the mean)."""
        return ctc_losses(out, to_device(labels, device), out_lens, label_lens, ctc_kernel, zero_infinity=False)

    def texts(self, model, out, out_lens, count: int, units=None, decoder: str = "greedy", beam: int = 1
              ) -> list[str]:
        paths = out.argmax(-1).cpu()  # (T', B)
        decode = units.decode if units is not None else alphabet.decode
        return [decode(alphabet.collapse(paths[: int(out_lens[b]), b].tolist()))
                for b in range(min(count, paths.shape[1]))]

    def probe_loss(self, model, out, out_lens, label_lens=None) -> torch.Tensor:
        return out.float().sum()  # every log-probability's gradient: what the step's backward reaches

    def check_memory(self, model, cfg, batching, index, units, device) -> None:
        """Nothing beyond the model's activations: CTC's loss holds a (T', B, C) lattice, no joint."""

    def synthetic_loss(self, model, out, out_lens, classes: int) -> torch.Tensor:
        """The mean CTC loss of random letters, a third of each utterance's frames (``bench zoo``)."""
        label_lens = (out_lens // 3).clamp(min=1)  # (B,): every label sequence fits its frames
        labels = torch.randint(2, min(28, classes), (int(label_lens.sum()),), device=out.device)
        losses = ctc_losses(out.float(), labels, out_lens, label_lens, "numba", zero_infinity=True)
        return (losses / label_lens.clamp(min=1)).mean()  # F.ctc_loss's reduction="mean"

    def warm_decode(self, decoder, classes: int, frames: int) -> None:
        """Decode a random batch of ``classes`` symbols: compiles every kernel the evaluation calls."""
        rng = np.random.default_rng(0)
        logits = rng.standard_normal((frames, 2, classes)).astype(np.float32)  # (T, B, C)
        log_probs = logits - np.log(np.exp(logits).sum(axis=2, keepdims=True))
        decoder.decode_batch(log_probs.astype(np.float32), np.array([frames, frames // 2], dtype=np.int64))


def ctc_losses(log_probs: torch.Tensor, labels: torch.Tensor, out_lens, label_lens, kernel: str,
               zero_infinity: bool) -> torch.Tensor:
    """(B,) per-utterance CTC losses of log-probabilities (T', B, C), blank 0: by speechperf's kernel where
    they are on the CPU and ``kernel`` (``train.system.ctc_kernel``) is "numba", else by torch's."""
    if kernel == "numba" and log_probs.device.type == "cpu" and log_probs.dtype in (torch.float32, torch.float64):
        return ctc_cpu.ctc_loss(log_probs, labels, out_lens, label_lens, blank=0, zero_infinity=zero_infinity)
    return F.ctc_loss(log_probs, labels, out_lens, label_lens, blank=0, reduction="none", zero_infinity=zero_infinity)


def host_copy(log_probs: torch.Tensor) -> np.ndarray | Pending:
    """(T', B, C) log-probs as the decode threads read them: on the CPU the tensor's own array;
    from a CUDA device a :class:`Pending` pinned buffer that a non-blocking copy fills, ready
    when the event recorded after it fires (the decode thread waits on it, not the caller); from
    any other device a synchronous copy."""
    if log_probs.device.type != "cuda":
        return log_probs.cpu().numpy()
    buf = torch.empty(log_probs.shape, dtype=log_probs.dtype, pin_memory=True)
    buf.copy_(log_probs, non_blocking=True)
    copied = torch.cuda.Event(blocking=True)  # a waiting decode thread sleeps instead of spinning
    copied.record()
    return Pending(buf.numpy(), copied)  # the array keeps the pinned tensor alive
