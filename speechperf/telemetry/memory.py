"""A training run's memory per device, before anything is allocated: parameters, gradients, optimizer
state, mixed-precision copies, activations (with and without activation checkpointing per block)
and, for a transducer, its joint tensor; and the refusal of a run that will not fit.

Why here (telemetry, beside ``mfu``): it is knowledge about a run's configuration read from the
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
tests/telemetry/test_memory.py checks the sum against a measured peak), in units of one
(B, T', d_model) tensor per block: two feed-forwards keep 2 d + 2 ff each (their input, its
norm, the hidden layer's input to SiLU and the second linear's input), attention 9 d on the
fused path (input, norm, rotated q and k, the qkv output v is a view of, the output and its
projection's input) or 6 d on the math path plus 3 (B, H, T', T') weight tensors (softmax out,
dropout mask, dropped weights: a CPU with attention dropout takes this path), the convolution
module 8 d, the final norm d; and one dropout mask per dropout (2 ff + 4 d: on a CPU a float
mask in the activations' dtype, models/dropout.py; elsewhere torch's bool mask).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from speechperf.errors import SpeechperfError
from speechperf.models.fastconformer import block_parameters, parameter_count, stage_sizes

GB = 1e9
SHARDINGS = ("none", "fsdp")
OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "adadelta": 2, "sgd": 0}  # fp32 tensors per parameter (SGD: no momentum)
FEATURES = 93  # columns of a batch's features (80 log-mel + 13 MFCC), fp32
PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


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

    optimizer: str = "adamw"  # train.optimizer
    optimizer_impl: str = "fused"  # train.optimizer_impl: fused (no copies), foreach or forloop (masked copy-back)
    precision: str = "fp32"  # train.precision: bf16/fp16 add the cast weights and halve the activations
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
    return Setup(t.optimizer, t.optimizer_impl, t.precision, device_type, world, sharding,
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


RULES = ("fastconformer",)  # the models whose activations have a rule here


def has_rule(cfg) -> bool:
    """Whether :func:`estimate` can size model ``cfg``'s activations."""
    return getattr(cfg, "name", None) in RULES


def activation_bytes(cfg, batch: Batch, setup: Setup) -> int:
    """What autograd keeps of one batch for the backward pass of a FastConformer (``cfg``)."""
    if not has_rule(cfg):
        raise SpeechperfError(f"model {getattr(cfg, 'name', cfg)!r}: no activation rule (known: fastconformer)")
    e = PRECISION_BYTES[setup.precision]
    m = e if setup.device_type == "cpu" else 1
    t = stage_sizes(batch.frames)[-1]
    kept, masks, weights = activation_units(cfg, attention_path(cfg, setup))
    block = t * (kept * e + masks * m) + t * t * weights * (2 * e + m)
    front_kept, front_masks = _front_elements(cfg, batch.frames)
    head = t * (cfg.d_model * e + cfg.num_classes * 4 * 2)  # the head's input; fp32 log-probs and the logits
    ctc = t * (2 * batch.label_length + 1) * 4  # CTC's forward variables (T', 2 L + 1), fp32
    per_utt = front_kept * e + front_masks * m + head + ctc
    if setup.checkpointing:  # each block's input kept, one block's activations rebuilt at a time
        return batch.utterances * (per_utt + cfg.layers * t * cfg.d_model * e + block)
    return batch.utterances * (per_utt + cfg.layers * block)


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
    """The optimizer step's own bytes: none for a fused kernel; otherwise the masked step's copy of
    the parameters and state (train/step.py ``copy_back_step``), foreach's also one fp32 tensor of
    every parameter more (measured with SGD, no weight decay: the peak at the copy-back's
    ``torch.where``, two parameter sets above the parameters and gradients; XL 9.36 GB measured
    against 9.34 estimated)."""
    if setup.optimizer_impl == "fused":
        return 0
    copies = 4 * n * (1 + states) // world
    return copies + (4 * n // world if setup.optimizer_impl == "foreach" else 0)


def estimate(model_cfg, batch: Batch, setup: Setup = Setup(), parameters: int | None = None,
             joint_bytes: int = 0) -> MemoryEstimate:
    """Bytes per device of a training step of ``model_cfg`` on ``batch`` under ``setup``, from shapes
    alone (``parameters``: the model's count, default its formula; ``joint_bytes``: a transducer
    head's joint tensor and its gradient, which the transducer's own rule gives)."""
    bad = setup.problems()
    if bad:
        raise SpeechperfError("; ".join(bad))
    n = parameters if parameters is not None else parameter_count(model_cfg)
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
                          joint=joint_bytes, batch_bytes=inputs,
                          front_backward=front_backward_bytes(model_cfg, batch, setup),
                          step_temporaries=_step_temporaries(n, states, setup, w), setup=setup,
                          batch=batch, model=model_cfg, parameter_count=n)


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
                     f"{free_bytes / GB:.1f} GB free; what would fit: {'; '.join(ways) or 'nothing at this model size'}")


def _summary(e: MemoryEstimate) -> str:
    parts = e.parts()
    return ", ".join(f"{k} {v:.1f}" for k, v in parts.items() if k != "peak" and v >= 0.05)


def _rebuilt(e: MemoryEstimate, setup: Setup, batch: Batch) -> MemoryEstimate:
    """``e`` for another setup or batch (the model's parameters and joint rule kept)."""
    return estimate(e.model, batch, setup, parameters=e.parameter_count, joint_bytes=e.joint)


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


def allocated_peak(step) -> int:
    """Bytes ``step()`` allocated above what was allocated when it began, at its peak, as torch's CPU
    allocator saw them: torch.profiler's memory events (every allocation and free the allocator
    reports, in order; CPU torch keeps no ``max_memory_allocated``). Not the process's resident
    size: the C library keeps freed pages and an untouched allocation has none, so an RSS delta
    over- or under-reads by as much as a large tensor (measured: checked against tensors of known size)."""
    from torch.profiler import ProfilerActivity, profile  # the profiler only where a peak is measured
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
                     and e.device_type().name == "CPU"), key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages of ``tensors`` (a view and its base counted once)."""
    seen = {}
    for t in tensors:
        if t is not None:
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())
