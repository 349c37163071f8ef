"""One training step without host synchronization, and its results read in batches.

A GPU runs ahead of the Python loop only while the loop never waits for it. So the step
leaves its loss and its skip flag on the device (:class:`StepOut`), and the loop keeps
them in a :class:`StepMeter` that reads every pending step with one transfer every
``train.system.sync_every`` steps (and where a value is needed: sentence logging, checkpoints,
the end of an epoch). Everything the step decides on the host is computed from the
loader's CPU tensors: output lengths, the valid-frame index of the model's batch norm,
the impossible utterances and the divisor of the mean loss.

A step with a non-finite loss or gradient norm is skipped without asking the host:
the optimizer steps, then every parameter and every state tensor it touched is put back
where the step was bad (``torch.where`` on a device flag; GradScaler's check, which
reads the flag on the host, is not used). The count of consecutive bad steps, and the
divergence abort at ``train.stop.max_bad_losses``, are applied at the read point in step order,
so they name the same iteration as a per-step check would.

The loss is the model's objective's (speechperf/objectives/). What remains on a GPU: PyTorch's
CUDA CTC copies the length lists to the device with blocking copies inside ``F.ctc_loss``
(forward and backward); the loop adds none.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from speechperf.data import specaugment
from speechperf.data.specaugment import SpecAugmentConfig
from speechperf.errors import RunFailed
from speechperf.models.contract import autocast, planned_forward, to_device
from speechperf.objectives import objective_of
from speechperf.train.lamb import Lamb


class TrainingDiverged(RunFailed):
    """The run cannot train: too many consecutive non-finite steps, too large a share of
    skipped steps, or non-finite weights. Its status is ``diverged`` (exit 1)."""


@dataclass
class StepOut:
    """What one step leaves: device values (read later) and host values (known now)."""

    loss: torch.Tensor  # 0-dim fp32 on the device: the loss summed over the batch / possible utterances
    bad: torch.Tensor  # 0-dim bool on the device: non-finite loss or gradient norm, update undone
    impossible: int  # utterances whose labels cannot fit their output frames (host: from lengths)
    out: torch.Tensor  # the model's output, detached: CTC log-probs (T', B, C); transducer frames (B, T', J)
    out_lens: torch.Tensor  # (B,) output frames, on the CPU


def train_step(model, batch, optimizer, scaler, device: torch.device, tc,
               augment: SpecAugmentConfig | None = None) -> StepOut:
    """SpecAugment (``augment``, training batches only), forward, the model's objective's loss
    (objectives/: CTC, transducer), backward, clip, step; a non-finite step is undone on the device."""
    feats = to_device(batch.feats, device)  # queued, from pinned memory (the loader pins for a CUDA device)
    if augment is not None:
        feats = specaugment.apply(feats, batch.feat_lens, augment)  # masks drawn from the run's CPU RNG
    with autocast(device, tc.system.precision):
        out, out_lens = planned_forward(model, feats, batch.feat_lens, device)  # lengths planned on the CPU
    # the loss over the possible utterances; impossible ones (from CPU lengths) are zeroed and counted
    loss, impossible = objective_of(model).train_loss(model, out, out_lens, batch, device, tc)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()  # always: DDP needs every rank to reach the all-reduce
    scaler.unscale_(optimizer)
    clip = tc.optim.grad_clip if tc.optim.grad_clip > 0 else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    if hasattr(norm, "full_tensor"):  # fsdp: a DTensor, the norm over every rank's shards, replicated
        norm = norm.full_tensor()
    ok = torch.isfinite(loss.detach()) & torch.isfinite(norm)
    masked_step(optimizer, ok)
    scaler.update()  # fp16: the scale shrinks after an overflow, from its own device flag
    return StepOut(loss.detach(), ~ok, impossible, out.detach(), out_lens)


def masked_step(optimizer, ok: torch.Tensor) -> None:
    """``optimizer.step()`` kept only where the 0-dim bool ``ok`` is True: parameters and
    state go back to their values before the step otherwise. Exact when ``ok``; never waits on a GPU.

    A fused optimizer (AdamW's, SGD's ``fused=True``) is given ``ok`` as the ``found_inf`` flag
    its kernel skips the update on, as torch's GradScaler does: no copy of the parameters and
    state (the conformer preset's ~5,800 small kernels a step), the same numbers. Otherwise, on
    a CPU, the flag is read and the step skipped (a CPU tensor's value waits for nothing: the
    copies would cost ~2,200 kernels a step for transducer-cpu, for the same numbers; a state a
    skipped first step would have created stays absent, as the next step creates it); on other
    devices :func:`copy_back_step`."""
    if getattr(optimizer, "_step_supports_amp_scaling", False):
        optimizer.found_inf = (~ok).to(torch.float32)  # 0-dim, on ok's device; read by the fused step
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf
        return
    if ok.device.type == "cpu":
        if bool(ok):
            optimizer.step()
        return
    copy_back_step(optimizer, ok)


def copy_back_step(optimizer, ok: torch.Tensor) -> None:
    """:func:`masked_step` for any optimizer without a host read: parameters and state copied
    before the step and copied back where ``ok`` is False (two small kernels per tensor, plus the
    copies; a state the step created goes back to its initial zeros)."""
    params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    old = [(t, t.detach().clone()) for p in params
           for t in (p, *(v for v in optimizer.state.get(p, {}).values() if torch.is_tensor(v)))]
    fresh = [p for p in params if not optimizer.state.get(p)]
    optimizer.step()
    with torch.no_grad():
        for t, before in old:
            t.copy_(torch.where(ok, t, before))
        for p in fresh:  # created by this step (Adam's, AdaDelta's: zeros and step 0)
            for v in optimizer.state[p].values():
                if torch.is_tensor(v):
                    v.copy_(torch.where(ok, v, torch.zeros_like(v)))


@dataclass
class Pending:
    """A step whose device values are not read yet, with what the host knew at the time."""

    iteration: int
    loss: torch.Tensor
    bad: torch.Tensor
    row: dict | None = None  # the iteration row, completed with the loss at the read


@dataclass
class Read:
    """A step after the read: host values."""

    iteration: int
    loss: float
    bad: bool
    row: dict | None = None


@dataclass
class StepMeter:
    """Per-step device values, read back together: one host sync per read."""

    pending: list[Pending] = field(default_factory=list)
    reads: int = 0  # host reads so far (the sync count, for tests and benchmarks)

    def add(self, iteration: int, out: StepOut, row: dict | None = None) -> None:
        self.pending.append(Pending(iteration, out.loss, out.bad, row))

    def read(self) -> list[Read]:
        """Every pending step, in order, with one device-to-host transfer."""
        if not self.pending:
            return []
        values = torch.stack([torch.stack([p.loss.float(), p.bad.float()]) for p in self.pending]).tolist()
        self.reads += 1
        done = []
        for p, (loss, bad) in zip(self.pending, values):
            if p.row is not None:
                p.row["loss"] = loss
            done.append(Read(p.iteration, loss, bool(bad), p.row))
        self.pending.clear()
        return done


def count_steps(prog, reads: list[Read], max_bad_losses: int) -> None:
    """Apply read steps to ``prog``'s skip counters in step order; abort on divergence.

    ``prog`` has ``skipped_steps`` and ``consecutive_bad``."""
    for r in reads:
        if r.bad:
            prog.skipped_steps += 1
            prog.consecutive_bad += 1
            if prog.consecutive_bad > max_bad_losses:
                raise TrainingDiverged(f"{prog.consecutive_bad} consecutive steps with non-finite loss or gradients "
                                       f"(iteration {r.iteration}); the last checkpoint is kept")
        else:
            prog.consecutive_bad = 0


def read_point(iteration: int, tc) -> bool:
    """Whether the loop reads the device after this iteration: every ``sync_every`` steps
    and where a value is needed (sentence logging, checkpoints)."""
    return (iteration % tc.system.sync_every == 0 or iteration % tc.eval.sentence_every == 0
            or iteration % tc.system.checkpoint_every == 0)


def make_optimizer(model, tc, device: torch.device):
    """AdaDelta (the paper's), AdamW, plain SGD (paper 003's local optimizer, without
    momentum) or LAMB (MLPerf's RNN-T, train/lamb.py); ``optimizer_impl`` picks torch's foreach
    or fused kernels. On a GPU the step
    counters live on the device (``capturable``), so that :func:`masked_step` can undo a
    step without reading a flag on the host (SGD has no step counter)."""
    kw = {}
    if tc.optim.impl == "foreach":
        kw["foreach"] = True
    elif tc.optim.impl == "fused":
        kw["fused"] = True  # its step counters are device tensors already
    if tc.optim.name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=tc.optim.lr, weight_decay=tc.optim.weight_decay, **kw)
    if device.type == "cuda" and tc.optim.impl != "fused":
        kw["capturable"] = True
    if tc.optim.name == "lamb":  # its step counters are device tensors already
        return Lamb(model.parameters(), lr=tc.optim.lr, weight_decay=tc.optim.weight_decay)
    if tc.optim.name == "adadelta":
        return torch.optim.Adadelta(model.parameters(), lr=tc.optim.lr, weight_decay=tc.optim.weight_decay, **kw)
    return torch.optim.AdamW(model.parameters(), lr=tc.optim.lr, weight_decay=tc.optim.weight_decay, **kw)
