"""A training run's memory per device, before anything is allocated: parameters, gradients, optimizer
state, mixed-precision copies, activations (with and without activation checkpointing per block)
and, for a transducer, its joint tensor; and the refusal of a run that will not fit.

Why here (hardware, beside ``mfu``): it is knowledge about a run's configuration read from the
model's layer shapes and the batch's padded frames, like the FLOP count, needed both by the
run's admission (``train/``) and by ``bench scale`` (``bench/``), which both sit above this tier.

What a step holds at its peak (``train.step.train_step``'s order): the parameters, the optimizer's
state and the previous step's gradients are alive through the forward pass (the step zeroes the
gradients after it), so the peak is at the end of the forward pass, when every activation the
backward pass reads is held too, or at the optimizer step, when the new gradients and the step's
own temporaries are (``MemoryEstimate.peak``). Under ``fsdp`` (torch's FSDP2, ``fully_shard`` per
block) the fp32 parameters, gradients and optimizer state are divided by the world size and one
block's parameters are gathered unsharded (in the mixed-precision policy's dtype) at a time.

Activations are counted tensor by tensor from what autograd keeps for the backward pass of
:class:`speechperf.models.conformer.ConformerBlock` (enumerated with saved-tensor hooks, torch 2.13;
tests/hardware/test_memory.py checks the sum against a measured peak), in units of one
(B, T', d_model) tensor per block: two feed-forwards keep 2 d + 2 ff each (their input, its
norm, the hidden layer's input to SiLU and the second linear's input), attention 9 d on the
fused path (input, norm, rotated q and k, the qkv output v is a view of, the output and its
projection's input) or 6 d on the math path plus 3 (B, H, T', T') weight tensors (softmax out,
dropout mask, dropped weights: a CPU with attention dropout takes this path), the convolution
module 8 d, the final norm d; and one dropout mask per dropout (2 ff + 4 d: on a CPU a float
mask in the activations' dtype, models/dropout.py; elsewhere torch's bool mask).

The three heads on that encoder (the three objective families): CTC's linear head, its fp32
log-probabilities and lattice; the transducer's joint (``rnnt_loss.joint_bytes``: the (B, T', U+1, V)
logits, the loss's gradient buffer, a half-precision joint's fp32 copy, the lattice; and the joint's
tanh output, (B, T', U+1, joint_dim)) and its prediction network; the attention decoder's layers
(enumerated with saved-tensor hooks as the blocks were: per layer and label position 12 d + ff kept,
one ff more and 3 d + ff of masks with dropout, two LayerNorm statistics per norm and SDPA's
log-sum-exp per head; per layer and encoder frame the cross-attention's keys and values, 2 d) and its
output ((B, U+1, V) logits, their fp32 copy, the log-softmax the cross-entropy keeps).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from speechperf.errors import SpeechperfError
from speechperf.models import encdec, fastconformer, rnnt
from speechperf.models.fastconformer import block_parameters, stage_sizes
from speechperf.objectives.rnnt_loss import joint_bytes as rnnt_joint_bytes
from speechperf.telemetry.device_gpus import cuda_free_bytes

GB = 1e9
SHARDINGS = ("none", "fsdp")
OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "adadelta": 2, "sgd": 0}  # fp32 tensors per parameter (SGD: no momentum)
FEATURES = 93  # columns of a batch's features (80 log-mel + 13 MFCC), fp32
PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 2}  # fp8: its bf16 autocast's (models/fp8.py)


class DoesNotFit(SpeechperfError):
    """A run whose estimated peak exceeds the device's free memory (exit 2, before a run folder)."""


@dataclass(frozen=True)
class Batch:
    """The shape of one rank's batch: what the activations scale with."""

    utterances: int  # B
    frames: int  # input frames each is padded to (T, 10 ms each)
    label_length: int = 0  # the longest label (CTC's and a transducer's lattices), tokens


@dataclass(frozen=True)
class Setup:
    """How the run trains: what besides the batch sets its memory."""

    optimizer: str = "adamw"  # train.optim.name
    optimizer_impl: str = "fused"  # train.optim.impl: fused (no copies), foreach or default (copy-back off a CPU)
    precision: str = "fp32"  # train.system.precision: bf16/fp16 add the cast weights and halve the activations
    device_type: str = "cpu"  # cpu: float dropout masks; cuda: bool masks and fused attention with dropout
    world: int = 1  # ranks the run is sharded or replicated over
    sharding: str = "none"  # none (a DDP replica per rank) or fsdp (parameters, gradients, state / world)
    checkpointing: bool = False  # activation checkpointing per block: only the blocks' inputs are kept

    def problems(self) -> list[str]:
        out = []
        if self.optimizer not in OPTIMIZER_STATES:
            out.append(f"optimizer {self.optimizer!r}: no memory rule (known: {', '.join(OPTIMIZER_STATES)})")
        if self.precision not in PRECISION_BYTES:
            out.append(f"precision {self.precision!r} must be one of {', '.join(PRECISION_BYTES)}")
        if self.sharding not in SHARDINGS:
            out.append(f"sharding {self.sharding!r} must be one of {', '.join(SHARDINGS)}")
        if self.world < 1:
            out.append(f"world size {self.world} must be >= 1")
        return out


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device of one training step, by part."""

    parameters: int  # fp32 master parameters this rank holds (sharded: its shard)
    gradients: int  # fp32 gradients (sharded: its shard)
    optimizer: int  # optimizer state (sharded: its shard)
    unsharded: int  # fsdp: one block's parameters and gradients gathered whole; none: 0
    casts: int  # mixed precision: the 16-bit weight copies autocast keeps for the backward pass
    activations: int  # what autograd keeps for the backward pass of one batch
    joint: int  # a transducer's joint tensor (B, T', U + 1, V) and its gradient; 0 for CTC
    batch_bytes: int  # the batch itself on the device: (B, T, 93) fp32 features, the labels
    front_backward: int  # the front end's backward at its largest convolution (what is held then)
    step_temporaries: int  # the optimizer step's own copies (the masked step's copy-back, foreach's buffers)
    setup: Setup = field(default_factory=Setup)
    batch: Batch = field(default_factory=lambda: Batch(1, 1))
    model: object = None  # the model's config: what a changed setup or batch is estimated again from
    parameter_count: int = 0  # the model's parameters (all ranks together)

    def peak(self) -> int:
        """The largest of three moments (module docstring): the forward pass's end, the front end's
        backward, the optimizer step; parameters, state and one set of gradients are held at each."""
        held = self.parameters + self.optimizer + self.gradients + self.unsharded + self.batch_bytes
        return held + max(self.casts + self.activations + self.joint, self.front_backward, self.step_temporaries)

    def parts(self) -> dict[str, float]:
        """Gigabytes by part, and the peak."""
        names = ("parameters", "gradients", "optimizer", "unsharded", "batch_bytes", "casts", "activations", "joint",
                 "front_backward", "step_temporaries")
        return {**{n: getattr(self, n) / GB for n in names}, "peak": self.peak() / GB}


def run_setup(cfg, device_type: str, world: int = 1, sharding: str = "none") -> Setup:
    """The :class:`Setup` of a run's configuration (``cfg``: a RunConfig) on ``device_type``."""
    t = cfg.train
    return Setup(t.optim.name, t.optim.impl, t.system.precision, device_type, world, sharding,
                 bool(getattr(cfg.model, "activation_checkpointing", False)))


def duration_batch(max_duration: float, longest_s: float, frame_s: float = 0.01, labels_per_s: float = 6.25) -> Batch:
    """The widest batch ``loader.max_duration`` seconds allow when the longest utterance is ``longest_s``:
    as many of the longest as fit (the planner's cost: utterances x the longest), each padded to it;
    labels at ``labels_per_s`` (one per two 80 ms frames)."""
    frames = int(round(longest_s / frame_s))
    return Batch(max(1, int(max_duration // longest_s)), frames, max(1, int(longest_s * labels_per_s)))


def activation_units(cfg, attention: str) -> tuple[int, int, int]:
    """Per block, per (utterance, output frame): (elements kept in the activations' dtype, dropout mask
    elements, attention-weight elements per frame of the other frames) of a ConformerBlock."""
    d, ff = cfg.d_model, cfg.ff_mult * cfg.d_model
    attn = 9 * d if attention == "fused" else 6 * d
    kept = 2 * (2 * d + 2 * ff) + attn + 8 * d + d
    masks = 2 * (ff + d) + d + d
    weights = cfg.heads if attention == "math" else 0  # (B, H, T', T'): H per pair of frames
    return kept, masks, weights


def attention_path(cfg, setup: Setup) -> str:
    """``math`` where SDPA keeps the attention weights: on a CPU with attention dropout in training
    (torch 2.13's CPU flash kernel takes no dropout); ``fused`` otherwise."""
    return "math" if setup.device_type == "cpu" and cfg.attention_dropout > 0 else "fused"


def _front_elements(cfg, frames: int) -> tuple[int, int]:
    """FastConformer's dw_striding front end per utterance: (elements kept, dropout mask elements)."""
    c, times, freqs = cfg.subsampling_channels, stage_sizes(frames), stage_sizes(cfg.input_dim)
    kept = frames * cfg.input_dim + c * times[0] * freqs[0]  # the first conv's input, its ReLU's output
    for (t0, f0), (t1, f1) in zip(zip(times, freqs), zip(times[1:], freqs[1:])):
        kept += c * t0 * f0 + 2 * c * t1 * f1  # masked input, depthwise output, ReLU output
    kept += c * freqs[-1] * times[-1]  # the linear map's input
    return kept, cfg.d_model * times[-1]


RULES = ("fastconformer", "transducer (encoder=fastconformer)", "aed")  # the models with a rule here


def has_rule(cfg) -> bool:
    """Whether :func:`estimate` can size model ``cfg``'s activations: the FastConformer encoder under
    each of the three heads (CTC, a transducer's joint, an attention decoder)."""
    name = getattr(cfg, "name", None)
    return name in ("fastconformer", "aed") or (name == "transducer" and cfg.encoder == "fastconformer")


def model_parameters(cfg) -> int:
    """The parameters of a model with a rule, by its own formula."""
    return {"fastconformer": fastconformer.parameter_count, "transducer": rnnt.parameter_count,
            "aed": encdec.parameter_count}[cfg.name](cfg)


def activation_bytes(cfg, batch: Batch, setup: Setup) -> int:
    """What autograd keeps of one batch for the backward pass of a FastConformer encoder and its head
    (``cfg``: the CTC model, a transducer on it, the attention encoder-decoder); a transducer's joint
    apart (:func:`transducer_joint_bytes`)."""
    if not has_rule(cfg):
        raise SpeechperfError(f"model {getattr(cfg, 'name', cfg)!r}: no activation rule (known: {', '.join(RULES)})")
    e = PRECISION_BYTES[setup.precision]
    m = e if setup.device_type == "cpu" else 1
    t = stage_sizes(batch.frames)[-1]
    kept, masks, weights = activation_units(cfg, attention_path(cfg, setup))
    block = t * (kept * e + masks * m) + t * t * weights * (2 * e + m)
    front_kept, front_masks = _front_elements(cfg, batch.frames)
    per_utt = front_kept * e + front_masks * m + _head_bytes(cfg, batch, t, setup)
    if setup.checkpointing:  # each block's input kept, one block's activations rebuilt at a time
        return batch.utterances * (per_utt + cfg.layers * t * cfg.d_model * e + block)
    return batch.utterances * (per_utt + cfg.layers * block)


def _head_bytes(cfg, batch: Batch, t: int, setup: Setup) -> int:
    """One utterance's head: CTC's (its input, fp32 logits and log-probabilities, the lattice), a
    transducer's projections and prediction network, or the attention decoder (:func:`decoder_bytes`)."""
    e = PRECISION_BYTES[setup.precision]
    if cfg.name == "aed":
        return decoder_bytes(cfg, batch, t, setup)
    if cfg.name == "transducer":  # enc_proj's input and output; the prediction network's layers and projection
        u = batch.label_length + 1
        pred = cfg.pred_dim * (2 + 6 * cfg.pred_layers) + cfg.joint_dim
        return t * (cfg.d_model + cfg.joint_dim) * e + u * pred * e
    head = t * (cfg.d_model * e + cfg.num_classes * 4 * 2)  # the head's input; fp32 log-probs and the logits
    return head + t * (2 * batch.label_length + 1) * 4  # CTC's forward variables (T', 2 L + 1), fp32


def decoder_bytes(cfg, batch: Batch, t: int, setup: Setup) -> int:
    """One utterance's attention decoder over U + 1 positions and its T' encoder frames (module docstring)."""
    e = PRECISION_BYTES[setup.precision]
    m = e if setup.device_type == "cpu" else 1
    d, ff, u, v = cfg.d_model, cfg.dec_ff_mult * cfg.d_model, batch.label_length + 1, cfg.num_classes
    dropout = cfg.dec_dropout > 0
    layer = u * ((12 * d + ff * (1 + dropout)) * e + (3 * d + ff) * m * dropout + (6 + 2 * cfg.dec_heads) * 4)
    layer += t * 2 * d * e  # the cross-attention's keys and values
    embed = u * d * (e + m * dropout)  # the embedding with its positions, its dropout mask
    out = u * (2 * d * e + v * (e + (4 if e < 4 else 0) + 4))  # final norm, logits, their fp32 copy, log-softmax
    return cfg.dec_layers * layer + embed + out


def transducer_joint_bytes(cfg, batch: Batch, setup: Setup) -> int:
    """A transducer's joint at the loss (``rnnt_loss.joint_bytes``; a TDT's V + D outputs, its lattice's
    D float64 duration log-probabilities per cell, 40 bytes at D = 5, left out) and its tanh output (B, T', U+1, J),
    in the step's dtype; 0 for the other heads."""
    if getattr(cfg, "name", None) != "transducer":
        return 0
    dtype = torch.float32 if setup.precision == "fp32" else torch.bfloat16
    t, u = stage_sizes(batch.frames)[-1], batch.label_length + 1
    cells = batch.utterances * t * u
    return rnnt_joint_bytes(batch.utterances, t, u, rnnt.outputs(cfg), dtype) + cells * cfg.joint_dim * \
        PRECISION_BYTES[setup.precision]


def front_backward_bytes(cfg, batch: Batch, setup: Setup) -> int:
    """What the backward pass holds at the second stage's depthwise convolution, the front end's largest
    (its input is the first stage's output): the network's input, the first stage's ReLU output and
    its masked copy (kept for the ReLU and the convolution), the convolution's output gradient and
    input gradient; on a CPU also oneDNN's copies of its input and output gradient in its blocked
    layout (measured: the peak of a dw_striding step whose front end outweighs its blocks)."""
    e = PRECISION_BYTES[setup.precision]
    c, times, freqs = cfg.subsampling_channels, stage_sizes(batch.frames), stage_sizes(cfg.input_dim)
    first, second = c * times[0] * freqs[0], c * times[1] * freqs[1]
    held = batch.frames * cfg.input_dim + 3 * first + second
    copies = first + second if setup.device_type == "cpu" else 0
    return batch.utterances * (held + copies) * e


def _step_temporaries(n: int, states: int, setup: Setup, world: int) -> int:
    """The optimizer step's own bytes: none for a fused kernel; otherwise, off the CPU, the masked
    step's copy of the parameters and state (train/step.py ``copy_back_step``; a CPU reads the flag
    and copies nothing), foreach's also one fp32 tensor of every parameter more (measured with SGD,
    no weight decay, on a CPU when it still copied: the peak at the copy-back's ``torch.where``, two
    parameter sets above the parameters and gradients; XL 9.36 GB measured against 9.34 estimated)."""
    if setup.optimizer_impl == "fused":
        return 0
    copies = 0 if setup.device_type == "cpu" else 4 * n * (1 + states) // world
    return copies + (4 * n // world if setup.optimizer_impl == "foreach" else 0)


def estimate(model_cfg, batch: Batch, setup: Setup = Setup(), parameters: int | None = None,
             joint_bytes: int = 0) -> MemoryEstimate:
    """Bytes per device of a training step of ``model_cfg`` on ``batch`` under ``setup``, from shapes
    alone (``parameters``: the model's count, default its formula; ``joint_bytes``: bytes added to the
    joint's, to a transducer's own rule, :func:`transducer_joint_bytes`)."""
    bad = setup.problems()
    if bad:
        raise SpeechperfError("; ".join(bad))
    n = parameters if parameters is not None else model_parameters(model_cfg)
    w = setup.world if setup.sharding == "fsdp" else 1
    states = OPTIMIZER_STATES[setup.optimizer]
    low = PRECISION_BYTES[setup.precision]
    cast = low if setup.precision != "fp32" else 0
    block = block_parameters(model_cfg.d_model, model_cfg.ff_mult * model_cfg.d_model, model_cfg.conv_kernel)
    if setup.sharding == "fsdp":  # one block gathered whole (policy dtype) and its gradient before reduce-scatter
        unsharded, casts = 2 * block * (low if cast else 4), 0
    else:
        unsharded, casts = 0, cast * n
    inputs = batch.utterances * (batch.frames * FEATURES * 4 + 8 * batch.label_length)  # int64 labels
    return MemoryEstimate(parameters=4 * n // w, gradients=4 * n // w, optimizer=4 * states * n // w,
                          unsharded=unsharded, casts=casts, activations=activation_bytes(model_cfg, batch, setup),
                          joint=joint_bytes + transducer_joint_bytes(model_cfg, batch, setup), batch_bytes=inputs,
                          front_backward=front_backward_bytes(model_cfg, batch, setup),
                          step_temporaries=_step_temporaries(n, states, setup, w), setup=setup,
                          batch=batch, model=model_cfg, parameter_count=n)


def free_bytes(device: torch.device, local_ranks: int = 1) -> int:
    """What one rank on ``device`` may use: a GPU's free memory and what this process's caching
    allocator holds unused (an earlier row's blocks: torch frees them for an allocation that needs
    them, so they are no less free; the driver counts them used); on a CPU the host's available
    memory shared by the ``local_ranks`` processes of this node (each would otherwise count all of it:
    two ranks of a 10 GB step on a 21 GB host each fit alone and are killed together)."""
    if device.type == "cuda":
        return cuda_free_bytes(device)
    import psutil  # only where a CPU's memory is asked

    return psutil.virtual_memory().available // max(1, local_ranks)


def check_fits(estimate: MemoryEstimate, free_bytes: int) -> None:
    """Refuse (:class:`DoesNotFit`, exit 2) a run whose peak exceeds ``free_bytes``, naming the
    gigabytes and what would fit: more ranks (fsdp), activation checkpointing, a shorter batch."""
    need = estimate.peak()
    if need <= free_bytes:
        return
    s = estimate.setup
    ways = []
    for world in (2, 4, 8, 16, 32, 64, 128, 256):
        if world > s.world and _fits(estimate, replace(s, sharding="fsdp", world=world), free_bytes):
            ways.append(f"{world} ranks sharded (fsdp)")
            break
    if not s.checkpointing and _fits(estimate, replace(s, checkpointing=True), free_bytes):
        ways.append("activation checkpointing per block")
    share = _batch_share(estimate, free_bytes)
    if share is not None:
        ways.append(f"batches of at most {share:.0%} of this one's audio")
    raise DoesNotFit(f"the run needs {need / GB:.1f} GB per device ({_summary(estimate)}) and the device has "
                     f"{free_bytes / GB:.1f} GB free; what would fit: "
                     f"{'; '.join(ways) or 'nothing at this model size'}")


def _summary(e: MemoryEstimate) -> str:
    parts = e.parts()
    return ", ".join(f"{k} {v:.1f}" for k, v in parts.items() if k != "peak" and v >= 0.05)


def _rebuilt(e: MemoryEstimate, setup: Setup, batch: Batch) -> MemoryEstimate:
    """``e`` for another setup or batch (the model's parameters and joint rule kept)."""
    extra = e.joint - transducer_joint_bytes(e.model, e.batch, e.setup)  # what the caller added; the rule's again
    return estimate(e.model, batch, setup, parameters=e.parameter_count, joint_bytes=extra)


def _fits(e: MemoryEstimate, setup: Setup, free_bytes: int) -> bool:
    return _rebuilt(e, setup, e.batch).peak() <= free_bytes


def _batch_share(e: MemoryEstimate, free_bytes: int) -> float | None:
    """The largest share of the batch's utterances (in steps of 5%) that fits, or None."""
    for pct in range(95, 0, -5):
        b = replace(e.batch, utterances=max(1, e.batch.utterances * pct // 100))
        if _rebuilt(e, e.setup, b).peak() <= free_bytes:
            return pct / 100
        if b.utterances == 1:
            return None
    return None


def allocated_peak(step, before=None) -> int:
    """Bytes ``step()`` allocated above what was allocated when it began, at its peak, as torch's CPU
    allocator saw them: torch.profiler's memory events (every allocation and free the allocator
    reports, in order; CPU torch keeps no ``max_memory_allocated``). Not the process's resident
    size: the C library keeps freed pages and an untouched allocation has none, so an RSS delta
    over- or under-reads by as much as a large tensor (measured: checked against tensors of known size).

    The profiler reports no free of a block allocated before it started (tests/hardware/test_memory.py),
    so a block the step frees but did not allocate would be counted as still held: a training step
    frees the previous step's gradients. ``before()`` therefore runs under the profiler too (say
    :func:`fresh_gradients`), and only the events inside ``step()`` are summed: what it frees was
    allocated in view."""
    from torch.profiler import ProfilerActivity, profile, record_function  # only where a peak is measured
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        if before is not None:
            before()
        with record_function(_MEASURED):
            step()
    events = list(prof.profiler.kineto_results.events())
    mark = next(e for e in events if e.name() == _MEASURED)
    start, end = mark.start_ns(), mark.start_ns() + mark.duration_ns()
    inside = sorted((e for e in events if e.name() == "[memory]" and e.device_type().name == "CPU"
                     and start <= e.start_ns() <= end), key=lambda e: e.start_ns())
    live = peak = 0
    for e in inside:
        live += e.nbytes()
        peak = max(peak, live)
    return peak


_MEASURED = "speechperf.measured_step"  # the profiler's range around the measured step


def fresh_gradients(parameters) -> None:
    """Each gradient replaced by a copy of itself, one at a time: allocated now, so that under the
    profiler a step's free of it is seen (the :func:`allocated_peak` ``before`` of a training step,
    far lighter than profiling the step before: the profiler's records cost a rank gigabytes at XL)."""
    for p in parameters:
        if p.grad is not None:
            p.grad = p.grad.clone()


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages of ``tensors`` (a view and its base counted once; a sharded
    DTensor's local shard, what this rank holds)."""
    seen = {}
    for t in tensors:
        if t is not None:
            s = (t.to_local() if hasattr(t, "to_local") else t).untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())
