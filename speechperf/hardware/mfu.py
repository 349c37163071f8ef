"""Model FLOPs utilization (MFU): the model's training FLOPs per second over the device's peak.

What MFU counts here: the FLOPs of the model's matrix multiplies, convolutions, recurrent
layers and attention in one training step's forward and backward pass (the backward as
torch's counter has it: the gradients of the inputs and weights that need them, about
twice the forward), over the *valid* frames of each utterance only. What it does not
count: padding frames (a padded batch computes them, the model does not need them), the
loss (CTC), element-wise work (activations, normalization, dropout, softmax), the
optimizer update, gradient clipping, data loading and evaluation. The seconds are the
training steps' wall time (loader waits included, evaluation excluded), so MFU is the
share of the device's peak that went into the model's own arithmetic: a slow loader, an
optimizer or element-wise kernels lower it; padding does not raise it.

How the count is made: torch's ``FlopCounterMode`` on real shapes, on the CPU, on a fresh
copy of the model (the run's RNG streams untouched), forward + backward of one utterance
at a few lengths. Two ops torch's counter has no formula for on the CPU are added:
oneDNN's recurrent layer (``mkldnn_rnn_layer``, what ``nn.LSTM``/``nn.GRU`` run on CPU)
and the CPU flash attention of ``scaled_dot_product_attention``; their backward is
counted as twice the forward (model FLOPs: the recomputation a fused kernel does is not
the model's). An utterance's FLOPs grow linearly with its length for convolutions and
LSTMs and quadratically for attention, so ``flops(L) = a + b L + c L^2`` (L: input
frames) is fitted exactly through three counts at lengths ``L = 0 (mod 16)``; a batch's
FLOPs are then host arithmetic on the loader's CPU lengths. Strided convolutions round
their output length, so at other lengths the fit is off by under one output frame's
FLOPs per strided stage (tested).

One formula of torch's own is replaced: torch 2.13 counts a grouped convolution's weight
gradient as if every input channel fed every output channel (``groups`` ignored), which
makes a depthwise convolution's backward ``channels`` times too large (a Conformer's
training FLOPs 2-27% too high; ledger: bench_mfu). ``_conv_backward_flop`` divides that term
by ``groups``, as torch's later formula does.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from fractions import Fraction

import torch
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count, sdpa_flop_count

from speechperf.models.contract import planned_forward
from speechperf.hardware.measured_peak import cpu_dtype, forget, training_peak
from speechperf.features.feature_config import FeatureConfig
from speechperf.models import build_model
from speechperf.objectives import objective_of

aten = torch.ops.aten
MODULUS = 16  # fit lengths share their residue mod 16: exact for total strides dividing 16
FIT_STRIDE = 4 * MODULUS  # frames between the fitted lengths


def _rnn_layer_flop(input_shape, w_ih_shape, w_hh_shape, *args, out_shape=None, **kwargs) -> int:
    """One recurrent layer, forward: every step multiplies the input and the previous hidden
    state by the gate weights (``(G*H, I)`` and ``(G*H, H)``), 2 FLOPs per multiply-add."""
    steps = input_shape[0] * input_shape[1]  # T x B, in either layout
    return 2 * steps * (w_ih_shape[0] * w_ih_shape[1] + w_hh_shape[0] * w_hh_shape[1])


def _rnn_layer_backward_flop(input_shape, w_ih_shape, w_hh_shape, *args, out_shape=None, **kwargs) -> int:
    """Backward: the gradients of the layer's input (and previous hidden state) and of its
    weights, each as many multiply-adds as the forward."""
    return 2 * _rnn_layer_flop(input_shape, w_ih_shape, w_hh_shape)


def _cpu_attention_flop(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(q_shape, k_shape, v_shape)


def _cpu_attention_backward_flop(grad_shape, q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * sdpa_flop_count(q_shape, k_shape, v_shape)  # dQ, dK, dV and dScores; no recomputation


def _channels_first(shape) -> list[int]:
    """(N, C, ...) -> (C, N, ...): a weight gradient is a convolution over the batch dimension."""
    return [shape[1], shape[0], *shape[2:]]


def _conv_backward_flop(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                        _output_padding, groups, output_mask, out_shape=None, **kwargs) -> int:
    """A convolution's backward: the input gradient (a transposed convolution of the output
    gradient with the weight, whose shape already holds ``in_channels / groups``) and the
    weight gradient (a convolution of the input with the output gradient over the batch).
    Each of ``groups`` groups pairs only its own channels, so the weight gradient is
    ``1 / groups`` of what the dense formula gives (torch 2.13 leaves ``groups`` out; a
    depthwise convolution's backward then reads ``channels`` times its real cost)."""
    flops = 0
    if output_mask[0]:
        flops += conv_flop_count(grad_out_shape, w_shape, list(out_shape[0]), not transposed)
    if output_mask[1]:
        x, dy, dw = _channels_first(x_shape), _channels_first(grad_out_shape), _channels_first(out_shape[1])
        dense = conv_flop_count(dy, x, dw) if transposed else conv_flop_count(x, dy, dw)
        flops += dense // groups  # exact: the dense count holds the full in (or out) channel count
    return flops


# What torch's counter lacks or miscounts on the CPU; passed per counter, torch's global
# registry is left alone.
CPU_FORMULAS = {
    aten.convolution_backward: _conv_backward_flop,
    aten.mkldnn_rnn_layer: _rnn_layer_flop,
    aten.mkldnn_rnn_layer_backward: _rnn_layer_backward_flop,
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flop,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_attention_backward_flop,
}


def counter() -> FlopCounterMode:
    """torch's FLOP counter with the CPU formulas above."""
    return FlopCounterMode(display=False, custom_mapping=CPU_FORMULAS)


def count_step_flops(model: torch.nn.Module, lengths: list[int], input_dim: int,
                     label_lengths: list[int] | None = None) -> int:
    """Training FLOPs (forward + backward, no optimizer, no loss kernel) of one batch of utterances of
    ``lengths`` frames, padded to the longest, counted by FlopCounterMode on ``model`` (on the CPU,
    in training mode) through its objective (``probe_loss``: a transducer's prediction and joint
    networks over ``label_lengths`` labels too). The RNG streams are left as they were."""
    lens = torch.tensor(lengths, dtype=torch.long)
    labels = torch.tensor(label_lengths, dtype=torch.long) if label_lengths is not None else None
    with torch.random.fork_rng(devices=[]):
        x = torch.randn(len(lengths), int(lens.max()), input_dim)  # (B, T, F)
        model.train()
        with counter() as fc:
            out, out_lens = planned_forward(model, x, lens)  # as the step calls it
            objective_of(model).probe_loss(model, out, out_lens, labels).backward()
    model.zero_grad(set_to_none=True)
    return fc.get_total_flops()


def exact_quadratic(points: dict[int, int]) -> tuple[Fraction, Fraction, Fraction]:
    """(a, b, c) of the quadratic a + b L + c L^2 through three (L, flops) points, exactly."""
    (x0, y0), (x1, y1), (x2, y2) = sorted(points.items())
    d01 = Fraction(y1 - y0, x1 - x0)
    d12 = Fraction(y2 - y1, x2 - x1)
    c = (d12 - d01) / (x2 - x0)
    b = d01 - c * (x0 + x1)
    a = y0 - b * x0 - c * x0 * x0
    return a, b, c


@dataclass(frozen=True)
class FlopModel:
    """Training FLOPs of one utterance of L input frames and U labels: ``a + b L + c L^2 + d U + e L U
    + f U^2`` (``d``, ``e``: a transducer's prediction network over its labels and its joint over frames
    x labels, an attention decoder's layers and its cross-attention; ``f``: an attention decoder's
    self-attention; 0 for CTC, whose FLOPs do not depend on the labels)."""

    model: str  # the model's registry name
    a: float  # FLOPs independent of length
    b: float  # per frame (convolutions, LSTMs, linear layers)
    c: float  # per frame squared (attention)
    fit_lengths: tuple[int, ...]  # where the three counts were made
    d: float = 0.0  # per label (a transducer's prediction network)
    e: float = 0.0  # per frame x label (a transducer's joint network)
    fit_labels: tuple[int, ...] = ()  # the label counts of the label terms' fit (none: no label terms)
    f: float = 0.0  # per label squared (an attention decoder's self-attention; objectives' ``label_squares``)

    def utterance(self, frames: int, labels: int = 0) -> float:
        return (self.a + self.b * frames + self.c * frames * frames + self.d * labels + self.e * frames * labels
                + self.f * labels * labels)

    def batch(self, feat_lens: torch.Tensor, label_lens: torch.Tensor | None = None) -> float:
        """The FLOPs of a batch from the loader's CPU lengths (valid frames; padding not counted)."""
        lens = feat_lens.to(torch.float64)  # a CPU tensor: no device read
        flops = self.a * len(lens) + self.b * float(lens.sum()) + self.c * float((lens * lens).sum())
        if self.fit_labels and label_lens is not None:
            labels = label_lens.to(torch.float64)
            flops += self.d * float(labels.sum()) + self.e * float((lens * labels).sum())
            flops += self.f * float((labels * labels).sum())
        return flops

    def to_dict(self) -> dict:
        out = {**asdict(self), "fit_lengths": list(self.fit_lengths),
               "formula": "training FLOPs per utterance of L input frames = a + b L + c L^2"}
        if not self.fit_labels:  # CTC: as before objectives had label terms
            return {k: v for k, v in out.items() if k not in ("d", "e", "f", "fit_labels")}
        if len(self.fit_labels) > 2:  # an attention decoder's self-attention: U^2
            return {**out, "fit_labels": list(self.fit_labels), "formula": "training FLOPs per utterance of L input "
                    "frames and U labels = a + b L + c L^2 + d U + e L U + f U^2"}
        out.pop("f")  # a transducer's: as before the U^2 term
        return {**out, "fit_labels": list(self.fit_labels),
                "formula": "training FLOPs per utterance of L input frames and U labels "
                           "= a + b L + c L^2 + d U + e L U"}


def fit_lengths(min_frames: int) -> list[int]:
    """Three lengths, multiples of MODULUS, past the model's shortest input."""
    first = MODULUS * (min_frames // MODULUS + 2)
    return [first + k * FIT_STRIDE for k in range(3)]


FIT_LABELS = (4, 12)  # label counts of a transducer's label terms' fit
SQUARE_LABELS = 20  # the third label count where the objective's FLOPs grow with U^2 too (``label_squares``)


def fit_flop_model(model: torch.nn.Module, name: str, input_dim: int, min_frames: int) -> FlopModel:
    """Count ``model`` at three lengths and fit the per-utterance quadratic through them; a model
    whose objective's FLOPs grow with the labels (``label_terms``) is counted at two label counts
    as well, for ``d`` and ``e`` (two more counts: exact where the terms are those of the form)."""
    lengths = fit_lengths(min_frames)
    if not getattr(objective_of(model), "label_terms", False):
        counts = {n: count_step_flops(model, [n], input_dim) for n in lengths}
        a, b, c = exact_quadratic(counts)
        return FlopModel(name, float(a), float(b), float(c), tuple(lengths))
    u0, u1 = FIT_LABELS
    counts = {n: count_step_flops(model, [n], input_dim, [u0]) for n in lengths}
    a0, b0, c = exact_quadratic(counts)  # at u0 labels: a + d u0, b + e u0, c
    (l0, f0), (l1, f1) = [(n, count_step_flops(model, [n], input_dim, [u1]) - counts[n]) for n in lengths[:2]]
    e = Fraction(f1 - f0, (l1 - l0) * (u1 - u0))  # f(L) = (d + e L)(u1 - u0) [+ f (u1^2 - u0^2)]
    d = Fraction(f0, u1 - u0) - e * l0
    if getattr(objective_of(model), "label_squares", False):
        return _with_squares(model, name, input_dim, lengths, counts, (a0, b0, c, d, e))
    return FlopModel(name, float(a0 - d * u0), float(b0 - e * u0), float(c), tuple(lengths), float(d), float(e),
                     FIT_LABELS)


def _with_squares(model, name: str, input_dim: int, lengths: list[int], counts: dict, fit: tuple) -> FlopModel:
    """The fit of :func:`fit_flop_model` with an ``f U^2`` term: one more count at ``SQUARE_LABELS``
    labels separates ``d`` from ``f`` (at u1 the fit's ``d`` is d + f (u0 + u1))."""
    a0, b0, c, d01, e = fit
    (u0, u1), u2, l0 = FIT_LABELS, SQUARE_LABELS, lengths[0]
    d02 = Fraction(count_step_flops(model, [l0], input_dim, [u2]) - counts[l0], u2 - u0) - e * l0  # d + f (u0 + u2)
    f = (d02 - d01) / (u2 - u1)
    d = d01 - f * (u0 + u1)
    return FlopModel(name, float(a0 - d * u0 - f * u0 * u0), float(b0 - e * u0), float(c), tuple(lengths),
                     float(d), float(e), (*FIT_LABELS, u2), float(f))


def flop_model(model_cfg) -> FlopModel:
    """The FLOP model of a fresh model of ``model_cfg``, built on the CPU (the RNG streams untouched)."""
    with torch.random.fork_rng(devices=[]):
        model = build_model(model_cfg)
    # the features every model is given (a model reads its first input_dim columns)
    return fit_flop_model(model, model_cfg.name, FeatureConfig().dim, model.min_frames)


def achieved(flops: float, seconds: float, peak_tflops: float | None) -> dict:
    """Achieved TFLOPS of ``flops`` in ``seconds`` and MFU in % of ``peak_tflops`` (None:
    no peak known, or no time measured). An achieved rate above the peak is no MFU but a peak
    that is wrong (a CPU's measured while the machine was busy): ``mfu_pct`` None and
    ``mfu_note`` saying so, never an MFU over 100%."""
    tflops = flops / seconds / 1e12 if seconds > 0 else None
    mfu = 100.0 * tflops / peak_tflops if tflops is not None and peak_tflops else None
    if mfu is not None and mfu > 100.0:
        return {"tflops": tflops, "mfu_pct": None, "mfu_note": above_peak(tflops, peak_tflops)}
    return {"tflops": tflops, "mfu_pct": mfu, "mfu_note": None}


def above_peak(tflops: float, peak_tflops: float) -> str:
    return (f"no MFU: the steps achieved {tflops:.4g} TFLOPS, above the peak of {peak_tflops:.4g} they are measured "
            f"against ({100.0 * tflops / peak_tflops:.0f}%): that peak is wrong")


@dataclass(frozen=True)
class RunFlops:
    """What a training run needs for MFU: its FLOP model and the device's peak, made once
    at initialization (outside the TTA clock)."""

    flops: FlopModel
    peak_tflops: float | None  # None: no peak known for this device and precision
    peak_source: str  # which peak, or why there is none
    init_s: float  # seconds spent counting and finding the peak
    cpu_peak: tuple[int, str] | None = None  # a CPU's measured peak: (threads, dtype) of its cache entry

    @classmethod
    def at_init(cls, cfg, device: torch.device) -> "RunFlops":
        t = time.perf_counter()
        fm = flop_model(cfg.model)
        threads = torch.get_num_threads()
        peak = training_peak(device, cfg.train.system.precision, threads)
        cpu = (threads, cpu_dtype(cfg.train.system.precision)) if device.type == "cpu" else None
        return cls(fm, peak.tflops, peak.source, time.perf_counter() - t, cpu)

    def row(self, batch) -> float:
        """The iteration row's ``model_flops``: the batch's training FLOPs."""
        return self.flops.batch(batch.feat_lens, batch.label_lens)

    def summary(self, iterations: list[dict]) -> dict:
        """summary.json's MFU facts over the run's iteration rows (:func:`steps_achieved`). Steps that
        beat a CPU's measured peak drop its cache entry (hardware/measured_peak.py): the next run measures it."""
        return {**forget_if_beaten(steps_achieved(iterations, self.peak_tflops), self.cpu_peak, "run"),
                "model_flops_fit": self.flops.to_dict(), "peak_tflops": self.peak_tflops,
                "peak_source": self.peak_source}


def forget_if_beaten(got: dict, cpu_peak: tuple[int, str] | None, by: str) -> dict:
    """``got`` (:func:`achieved`'s dict); where steps beat a CPU's measured peak (``cpu_peak``: the
    (threads, dtype) of its cache entry, None off a CPU), the entry dropped and the note saying so:
    the next ``by`` (a run, a bench row) measures it again (hardware/measured_peak.py)."""
    if got["mfu_note"] and cpu_peak is not None and forget(*cpu_peak):
        return {**got, "mfu_note": got["mfu_note"] + f" (measured low; its cached entry is dropped: the next {by} "
                                                     "measures it again)"}
    return got


def steps_achieved(iterations: list[dict], peak_tflops: float | None) -> dict:
    """MFU over a run's iteration rows: their ``model_flops`` over their ``step_s`` against
    ``peak_tflops`` (:func:`achieved`), with the FLOPs per step and the steps counted. Rows
    without ``model_flops`` (None: results/upgrade.py) are left out of both the FLOPs and the seconds. What
    a finished run's summary holds; a run stopped before its summary's MFU is read the same way."""
    counted = [r for r in iterations if r.get("model_flops") is not None and r.get("step_s")]
    flops = sum(r["model_flops"] for r in counted)
    seconds = sum(r["step_s"] for r in counted)
    return {"model_flops_per_step": flops / len(counted) if counted else None, "model_flops_steps": len(counted),
            **achieved(flops, seconds, peak_tflops)}


def mfu_columns(summary: dict) -> dict:
    """A run's table columns: achieved TFLOPS and MFU over its training steps and the peak
    behind the MFU, from its summary.json (None where it holds none)."""
    mfu, note = summary.get("mfu_pct"), summary.get("mfu_note")
    if mfu is not None and mfu > 100.0:  # a summary written before the check: the same verdict
        mfu, note = None, above_peak(summary["tflops"], summary["peak_tflops"])
    return {"TFLOPS": summary.get("tflops"), "MFU %": mfu, "MFU note": note,
            "peak TFLOPS": summary.get("peak_tflops"), "peak source": summary.get("peak_source")}


def zoo_mfu(flops_per_step: float, step_s: float, device: torch.device, precision: str,
            threads: int | None = None) -> dict:
    """For a ``bench zoo`` row: TFLOPS and MFU of a step of ``flops_per_step`` FLOPs taking
    ``step_s`` seconds, against the peak a training run on ``device`` uses (``peak_tflops``,
    ``peak_source`` too). ``flops_per_step``: e.g. ``count_step_flops`` of the row's batch."""
    peak = training_peak(device, precision, threads or torch.get_num_threads())
    return {**achieved(flops_per_step, step_s, peak.tflops), "peak_tflops": peak.tflops, "peak_source": peak.source}
