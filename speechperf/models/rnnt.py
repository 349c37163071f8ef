"""A transducer (RNN-T, Graves 2012): encoder, prediction network and joint network; registered
as ``transducer`` (this module is ``rnnt``: ``objectives/transducer.py`` is its objective's).

- **Encoder** (``encoder``): the Conformer's subsampling and blocks (models/conformer.py's
  layers, without its CTC head), the FastConformer's (models/fastconformer.py's encoder: 8x
  dw_striding subsampling, Parakeet's), or MLPerf RNN-T's LSTM encoder: ``frame_stack`` consecutive
  frames side by side (stacking x3 and subsampling x3 at the input), ``enc_pre_layers`` LSTM
  layers, a time stack (``time_stack`` adjacent outputs side by side, halving T), then
  ``enc_post_layers`` LSTM layers. Either one is projected to ``joint_dim``.
- **Prediction network** (``pred``): an embedding and ``pred_layers`` LSTM layers (NeMo's,
  MLPerf's), or icefall's stateless one: an embedding and a depthwise Conv1d over the last
  ``context_size`` tokens, then ReLU. Both read the labels with the blank (0) prepended as the
  start symbol; the blank embeds to zeros (``padding_idx``), so a stateless context padded with
  blanks on the left is the same as one padded with zeros. Projected to ``joint_dim``.
- **Joint**: ``Linear(tanh(enc + g))`` over every (frame, label position) pair: raw logits
  (B, T', U+1, V), the loss applies log-softmax. This tensor is what makes a transducer cost
  memory and memory bandwidth, not only GEMM rate: V x (U+1) times a CTC head's output.

The contract differs from the CTC models' in what :meth:`Transducer.forward` returns: the
encoder output projected to ``joint_dim`` (B, T', J), not log-probabilities; the objective
(speechperf/objectives) calls :meth:`Transducer.predict` and :meth:`Transducer.joint` and the
loss. Lengths, :meth:`~speechperf.models.contract.AcousticModel.plan` and the rule that
``forward`` never reads device values on the host are the contract's.

Padding never changes a sequence's output: the Conformer's own masking; the LSTM encoder's
stacks see zeros past each sequence's valid frames (masked before each stack), as the same
sequence alone sees the stack's zero padding, and its LSTMs are unidirectional. The
prediction network is causal, so label padding only changes positions past each label length.

A predictor's state is a tuple of tensors, each with the batch in dimension 0, so decoding
can select and merge states without knowing the predictor: LSTM ``(h, c)`` of (B, layers,
pred_dim) each; stateless ``(context,)``, the last ``context_size`` tokens (B, context_size).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from speechperf.corpus.alphabet import NUM_SYMBOLS
from speechperf.models import register_model
from speechperf.models.conformer import FEATURE_DIM, ConformerConfig, ConformerEncoder, valid_frames
from speechperf.models.contract import AcousticModel
from speechperf.models.dropout import Dropout
from speechperf.models.fastconformer import (FastConformerConfig, FastConformerEncoder, encoder_parameters,
                                             forward_flops, stage_sizes)

ENCODERS = ("conformer", "lstm", "fastconformer")
PREDICTORS = ("lstm", "stateless")
BLANK = 0  # the blank symbol, also the prediction network's start symbol
State = tuple[torch.Tensor, ...]  # a predictor's state: tensors with the batch in dimension 0


@dataclass(frozen=True)
class TransducerConfig:
    """A transducer; the defaults are NeMo's Conformer-Transducer small (encoder as the Conformer's
    defaults, one LSTM layer of 320 in the prediction network, joint 320)."""

    objective = "transducer"  # not a field: the objective its output is made for (speechperf/objectives)
    name: str = "transducer"  # registry key in speechperf.models.MODELS
    input_dim: int = 80  # feature columns read: the 80 log-mel (not the 13 MFCC after them)
    num_classes: int = NUM_SYMBOLS  # output units incl. the blank at 0 (30 characters; BPE units give more)
    encoder: str = "conformer"  # "conformer" (models/conformer.py's), "lstm" (MLPerf RNN-T's), "fastconformer"
    # the Conformer encoder (encoder="conformer"; "fastconformer": the same fields, subsampling 8 by dw_striding)
    d_model: int = 176  # width of the residual stream
    layers: int = 16  # Conformer blocks
    heads: int = 4  # attention heads (d_model / heads must be even: RoPE rotates pairs)
    conv_kernel: int = 31  # depthwise convolution width in (subsampled) frames; odd
    ff_mult: int = 4  # feed-forward hidden width = ff_mult x d_model
    subsampling: int = 4  # time reduction of the conv front end: 4 (Conformer), 8 (FastConformer), 2
    subsampling_channels: int = 176  # channels of the subsampling convs (narrow ones are cheap on CPU)
    attention_dropout: float = 0.1  # dropout on the attention weights (off SDPA's fused CPU path if > 0)
    activation_checkpointing: bool = False  # encoder="fastconformer": recompute each block in the backward pass
    # the LSTM encoder (encoder="lstm"): MLPerf RNN-T's shape
    frame_stack: int = 3  # input frames side by side, one stacked frame per frame_stack (MLPerf: 3)
    enc_pre_layers: int = 2  # LSTM layers before the time stack (MLPerf: 2)
    time_stack: int = 2  # adjacent outputs side by side after them, T / time_stack (MLPerf: 2)
    enc_post_layers: int = 3  # LSTM layers after the time stack (MLPerf: 3)
    enc_hidden: int = 1024  # units per encoder LSTM layer (MLPerf: 1024)
    dropout: float = 0.1  # encoder: every Conformer branch and FF hidden layer; after every LSTM layer
    # the prediction network
    pred: str = "lstm"  # "lstm" (embedding + LSTM layers) or "stateless" (embedding + depthwise conv)
    pred_dim: int = 320  # embedding and LSTM width of the prediction network
    pred_layers: int = 1  # LSTM layers (pred="lstm")
    context_size: int = 2  # tokens the stateless network sees, the last included (pred="stateless"; icefall: 2)
    pred_dropout: float = 0.1  # dropout on the prediction network's output (and between its LSTM layers)
    # the joint network
    joint_dim: int = 320  # width the encoder and prediction outputs are projected to and added in
    joint_dropout: float = 0.0  # dropout on tanh(enc + g), a (B, T', U+1, joint_dim) tensor: costly on a CPU
    # auxiliary CTC (NeMo's hybrid RNNT-CTC, icefall's CTC aux): a linear head on the encoder output
    ctc_weight: float = 0.0  # training loss (1 - w) x RNN-T + w x CTC of that head; 0: no head (no parameters)
    # TDT (Xu et al. 2023, Parakeet-TDT's head): the frames a token or blank may advance, comma-separated
    # ("0,1,2,3,4"), the joint emitting one duration logit each after the V token logits; "" = plain RNN-T
    durations: str = ""
    tdt_sigma: float = 0.0  # TDT: logit under-normalisation, subtracted from every token log-probability (paper 3.2)
    tdt_omega: float = 0.0  # TDT: loss (1 - omega) x TDT + omega x RNN-T of the token logits alone (NeMo's omega)

    def problems(self) -> list[str]:
        """One message per invalid value, naming ``model.FIELD=value``."""
        out = [f"model.{k}={getattr(self, k)} must be >= 1" for k in
               ("pred_dim", "pred_layers", "context_size", "joint_dim") if getattr(self, k) < 1]
        if self.num_classes < 2:
            out.append(f"model.num_classes={self.num_classes} must be >= 2 (the blank and one unit)")
        if self.encoder not in ENCODERS:
            out.append(f"model.encoder={self.encoder!r} must be one of {', '.join(ENCODERS)}")
        if self.pred not in PREDICTORS:
            out.append(f"model.pred={self.pred!r} must be one of {', '.join(PREDICTORS)}")
        if self.encoder == "conformer":
            out += conformer_config(self).problems()
        elif self.encoder == "fastconformer":
            out += fastconformer_config(self).problems()
            if self.subsampling != 8:
                out.append(f"model.subsampling={self.subsampling} must be 8 for model.encoder=fastconformer "
                           "(three stride-2 dw_striding stages)")
        elif self.encoder == "lstm":
            out += [f"model.{k}={getattr(self, k)} must be >= 1" for k in
                    ("frame_stack", "enc_pre_layers", "time_stack", "enc_post_layers", "enc_hidden")
                    if getattr(self, k) < 1]
            if not 1 <= self.input_dim <= FEATURE_DIM:
                out.append(f"model.input_dim={self.input_dim} must be in 1..{FEATURE_DIM} (the feature columns)")
            if not 0.0 <= self.dropout < 1.0:
                out.append(f"model.dropout={self.dropout} not in [0, 1)")
        if not 0.0 <= self.ctc_weight < 1.0:
            out.append(f"model.ctc_weight={self.ctc_weight} not in [0, 1) (the RNN-T loss keeps a share)")
        for field in ("pred_dropout", "joint_dropout"):
            if not 0.0 <= getattr(self, field) < 1.0:
                out.append(f"model.{field}={getattr(self, field)} not in [0, 1)")
        return out + duration_problems(self.durations) + self._tdt_problems()

    def _tdt_problems(self) -> list[str]:
        out = []
        if not 0.0 <= self.tdt_sigma < 1.0:
            out.append(f"model.tdt_sigma={self.tdt_sigma} not in [0, 1)")
        if not 0.0 <= self.tdt_omega < 1.0:
            out.append(f"model.tdt_omega={self.tdt_omega} not in [0, 1) (the TDT loss keeps a share)")
        out += [f"model.{k}={getattr(self, k)} needs model.durations (a TDT head): it is a TDT loss setting"
                for k in ("tdt_sigma", "tdt_omega") if getattr(self, k) and not self.durations.strip()]
        return out


def conformer_config(cfg: TransducerConfig) -> ConformerConfig:
    """The Conformer encoder's config: the transducer's fields of the same names (its CTC head's
    ``num_classes`` is not used)."""
    return ConformerConfig(input_dim=cfg.input_dim, d_model=cfg.d_model, layers=cfg.layers, heads=cfg.heads,
                           conv_kernel=cfg.conv_kernel, ff_mult=cfg.ff_mult, subsampling=cfg.subsampling,
                           subsampling_channels=cfg.subsampling_channels, dropout=cfg.dropout,
                           attention_dropout=cfg.attention_dropout)


def fastconformer_config(cfg: TransducerConfig) -> FastConformerConfig:
    """The FastConformer encoder's config (encoder="fastconformer"): the transducer's fields of the same names."""
    return FastConformerConfig(input_dim=cfg.input_dim, d_model=cfg.d_model, layers=cfg.layers, heads=cfg.heads,
                               conv_kernel=cfg.conv_kernel, ff_mult=cfg.ff_mult,
                               subsampling_channels=cfg.subsampling_channels, dropout=cfg.dropout,
                               attention_dropout=cfg.attention_dropout,
                               activation_checkpointing=cfg.activation_checkpointing)


def ceil_div(lengths: torch.Tensor, factor: int) -> torch.Tensor:
    """ceil(L / factor): the frames of a stack of ``factor`` with the last one zero-padded."""
    return torch.div(lengths + factor - 1, factor, rounding_mode="floor")


def stack_frames(x: torch.Tensor, lengths: torch.Tensor, factor: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T, C) -> (B, ceil(T / factor), factor x C): each ``factor`` consecutive frames side by
    side (MLPerf's frame stacking with subsampling, and its time stack), zeros past each sequence's
    valid frames (so a padded batch stacks as each sequence alone)."""
    if factor == 1:
        return x, lengths
    b, t, c = x.shape
    x = x.masked_fill(~valid_frames(lengths, t)[:, :, None], 0.0)
    x = F.pad(x, (0, 0, 0, -t % factor))  # (B, T, C) -> (B, T + pad, C), T + pad a multiple of factor
    return x.reshape(b, x.shape[1] // factor, factor * c), ceil_div(lengths, factor)  # (B, T'', factor C)


class LSTMEncoder(nn.Module):
    """MLPerf RNN-T's encoder: frame stack -> LSTMs -> time stack -> LSTMs, dropout after each LSTM.
    One LSTM per layer (not a multi-layer nn.LSTM) so that the dropout between them is
    speechperf's cheap CPU mask (models/dropout.py)."""

    min_frames = 1

    def __init__(self, cfg: TransducerConfig):
        super().__init__()
        self.cfg, h = cfg, cfg.enc_hidden
        pre_in, post_in = cfg.frame_stack * cfg.input_dim, cfg.time_stack * h
        self.pre = nn.ModuleList(nn.LSTM(pre_in if i == 0 else h, h, batch_first=True)
                                 for i in range(cfg.enc_pre_layers))
        self.post = nn.ModuleList(nn.LSTM(post_in if i == 0 else h, h, batch_first=True)
                                  for i in range(cfg.enc_post_layers))
        self.drop = Dropout(cfg.dropout)

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        return ceil_div(ceil_div(lengths, self.cfg.frame_stack), self.cfg.time_stack)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (B, T, 93) features, lengths: (B,) -> hidden (B, T', enc_hidden), out lengths (B,)."""
        h, lens = stack_frames(x[..., : self.cfg.input_dim], lengths, self.cfg.frame_stack)  # (B, T/3, 3F)
        for lstm in self.pre:
            h = self.drop(lstm(h)[0])  # (B, T/3, H)
        h, lens = stack_frames(h, lens, self.cfg.time_stack)  # (B, T/6, 2H)
        for lstm in self.post:
            h = self.drop(lstm(h)[0])  # (B, T/6, H)
        return h, lens


class LSTMPredictor(nn.Module):
    """Embedding -> ``pred_layers`` LSTM layers -> dropout; state ``(h, c)``, (B, layers, pred_dim) each."""

    def __init__(self, cfg: TransducerConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.num_classes, cfg.pred_dim, padding_idx=BLANK)
        self.lstm = nn.LSTM(cfg.pred_dim, cfg.pred_dim, cfg.pred_layers, batch_first=True,
                            dropout=cfg.pred_dropout if cfg.pred_layers > 1 else 0.0)
        self.drop = Dropout(cfg.pred_dropout)

    def forward(self, y: torch.Tensor, state: State | None = None) -> tuple[torch.Tensor, State]:
        """y: (B, U) tokens -> (B, U, pred_dim), the state after the last column."""
        hx = None if state is None else tuple(s.transpose(0, 1).contiguous() for s in state)  # (L, B, P) each
        out, (h, c) = self.lstm(self.embed(y), hx)  # (B, U, P); (L, B, P) each
        return self.drop(out), (h.transpose(0, 1), c.transpose(0, 1))  # state batch-first: (B, L, P)


class StatelessPredictor(nn.Module):
    """icefall's stateless prediction network: embedding -> depthwise Conv1d over the last
    ``context_size`` tokens (none for a context of 1) -> ReLU -> dropout; state: those tokens."""

    def __init__(self, cfg: TransducerConfig):
        super().__init__()
        self.context = cfg.context_size
        self.embed = nn.Embedding(cfg.num_classes, cfg.pred_dim, padding_idx=BLANK)
        self.conv = (nn.Conv1d(cfg.pred_dim, cfg.pred_dim, cfg.context_size, groups=cfg.pred_dim, bias=False)
                     if cfg.context_size > 1 else None)
        self.drop = Dropout(cfg.pred_dropout)

    def forward(self, y: torch.Tensor, state: State | None = None) -> tuple[torch.Tensor, State]:
        """y: (B, U) tokens -> (B, U, pred_dim), the last ``context_size`` tokens read."""
        before = y.new_full((y.shape[0], self.context - 1), BLANK) if state is None else state[0][:, 1:]
        full = torch.cat((before, y), dim=1)  # (B, C - 1 + U): each column's context on its left
        h = self.embed(full)  # (B, C - 1 + U, P); the blank embeds to zeros
        if self.conv is not None:
            h = self.conv(h.transpose(1, 2)).transpose(1, 2)  # (B, P, C - 1 + U) -> valid conv -> (B, U, P)
        return self.drop(F.relu(h)), (full[:, full.shape[1] - self.context:],)


class Transducer(AcousticModel):
    """Encoder -> joint_dim; prediction network -> joint_dim; joint -> logits (B, T', U+1, V)."""

    min_frames = 1  # the Conformer's convs and the stacks both give one output frame for one input frame

    def __init__(self, cfg: TransducerConfig):
        super().__init__()
        self.cfg = cfg
        if cfg.encoder == "conformer":
            self.encoder, width = ConformerEncoder(conformer_config(cfg)), cfg.d_model
        elif cfg.encoder == "fastconformer":
            self.encoder, width = FastConformerEncoder(fastconformer_config(cfg)), cfg.d_model
        else:
            self.encoder, width = LSTMEncoder(cfg), cfg.enc_hidden
        self.enc_proj = nn.Linear(width, cfg.joint_dim)
        self.predictor = LSTMPredictor(cfg) if cfg.pred == "lstm" else StatelessPredictor(cfg)
        self.pred_proj = nn.Linear(cfg.pred_dim, cfg.joint_dim)
        self.joint_drop = Dropout(cfg.joint_dropout)
        self.out = nn.Linear(cfg.joint_dim, outputs(cfg))
        # made last, so that the other parameters draw the same initial values with or without it
        self.ctc_head = nn.Linear(cfg.joint_dim, cfg.num_classes) if cfg.ctc_weight > 0 else None

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """Encoder frames for input frames ``lengths`` (CPU arithmetic)."""
        return self.encoder.output_lengths(lengths)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, **planned) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (B, T, 93) features, lengths: (B,) -> encoder output (B, T', joint_dim), out lengths (B,)."""
        if lengths.device.type == "cpu":  # a CPU read costs nothing; on a GPU plan() checked it
            self.check_lengths(lengths)
        h, out_lens = self.encoder(x, lengths)
        return self.enc_proj(h), out_lens

    def predict(self, targets: torch.Tensor, state: State | None = None) -> tuple[torch.Tensor, State]:
        """targets: (B, U) labels (negative padding reads as the blank) -> (B, U+1, joint_dim) over
        the blank-prepended labels, and the state after the last column (padding included).
        ``state``: the state before the blank (None: the start)."""
        y = F.pad(targets.clamp(min=0), (1, 0), value=BLANK)  # (B, U) -> (B, U+1)
        g, state = self.predictor(y, state)
        return self.pred_proj(g), state

    def predict_step(self, tokens: torch.Tensor, state: State | None) -> tuple[torch.Tensor, State]:
        """One step: tokens (B,) after ``state`` (None: the start; feed the blank first) -> (B, joint_dim)."""
        g, state = self.predictor(tokens[:, None], state)  # (B, 1, P)
        return self.pred_proj(g[:, 0]), state

    def joint(self, enc: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """enc (B, T, 1, J) and g (B, 1, U+1, J), or any broadcastable pair -> logits (B, T, U+1, V)."""
        return self.out(self.joint_drop(torch.tanh(enc + g)))

    def ctc_log_probs(self, enc: torch.Tensor) -> torch.Tensor:
        """enc (B, T', joint_dim), the forward's output -> the auxiliary CTC head's log-probabilities
        (T', B, V) in float32 (``ctc_weight`` > 0 only: the head exists then)."""
        return self.ctc_head(enc).float().log_softmax(-1).transpose(0, 1)


def _conformer_parameters(cfg: TransducerConfig) -> int:
    d, c, m, k = cfg.d_model, cfg.subsampling_channels, cfg.ff_mult, cfg.conv_kernel
    stages, freq, sub = cfg.subsampling.bit_length() - 1, cfg.input_dim, 0
    for i in range(stages):  # 3x3 convs: 1 -> c, then c -> c
        sub += (1 if i == 0 else c) * c * 9 + c
        freq = (freq - 1) // 2 + 1
    sub += c * freq * d + d  # the linear map to d_model
    ln = 2 * d
    ff = ln + (d * m * d + m * d) + (m * d * d + d)
    attn = ln + (d * 3 * d + 3 * d) + (d * d + d)
    conv = ln + (d * 2 * d + 2 * d) + (d * k + d) + ln + (d * d + d)
    return sub + cfg.layers * (2 * ff + attn + conv + ln)


def _lstm_parameters(inputs: int, hidden: int) -> int:
    return 4 * hidden * (inputs + hidden) + 8 * hidden  # torch's LSTM: two bias vectors per gate set


def _encoder_parameters(cfg: TransducerConfig) -> int:
    if cfg.encoder == "conformer":
        return _conformer_parameters(cfg)
    if cfg.encoder == "fastconformer":
        return encoder_parameters(fastconformer_config(cfg))
    h = cfg.enc_hidden
    pre = _lstm_parameters(cfg.frame_stack * cfg.input_dim, h) + (cfg.enc_pre_layers - 1) * _lstm_parameters(h, h)
    return pre + _lstm_parameters(cfg.time_stack * h, h) + (cfg.enc_post_layers - 1) * _lstm_parameters(h, h)


def parameter_count(cfg: TransducerConfig) -> int:
    """Trainable parameters by formula: encoder, projections, prediction network, joint output."""
    width = cfg.enc_hidden if cfg.encoder == "lstm" else cfg.d_model
    p, j = cfg.pred_dim, cfg.joint_dim
    if cfg.pred == "lstm":
        pred = cfg.num_classes * p + cfg.pred_layers * _lstm_parameters(p, p)
    else:
        pred = cfg.num_classes * p + (p * cfg.context_size if cfg.context_size > 1 else 0)
    # the joint's output layer (V tokens and the TDT's durations), and the auxiliary CTC head's where there is one
    heads = (j * outputs(cfg) + outputs(cfg)) + ((j * cfg.num_classes + cfg.num_classes) if cfg.ctc_weight > 0 else 0)
    return _encoder_parameters(cfg) + (width * j + j) + pred + (p * j + j) + heads


def _conformer_flops(cfg: TransducerConfig, frames: int) -> tuple[float, int]:
    """Forward FLOPs of the Conformer encoder over ``frames`` input frames, and its output frames."""
    t, f, c_in, c, flops = frames, cfg.input_dim, 1, cfg.subsampling_channels, 0
    for _ in range(cfg.subsampling.bit_length() - 1):
        t, f = (t - 1) // 2 + 1, (f - 1) // 2 + 1
        flops += 2 * c_in * c * 9 * t * f  # a 3x3 stride-2 conv's outputs x its inputs per output
        c_in = c
    d, k = cfg.d_model, cfg.conv_kernel
    flops += 2 * c * f * d * t  # the linear map to d_model
    block = (2 * 2 * 2 * t * d * cfg.ff_mult * d  # two feed-forwards, two linears each
             + 2 * t * d * 3 * d + 2 * t * d * d  # QKV and output projections
             + 2 * 2 * t * t * d  # QK^T and AV over all heads
             + 2 * t * d * 2 * d + 2 * t * d * k + 2 * t * d * d)  # pointwise, depthwise, pointwise
    return flops + cfg.layers * block, t


def _fastconformer_flops(cfg: TransducerConfig, frames: int) -> tuple[float, int]:
    """Forward FLOPs of the FastConformer encoder (models/fastconformer.py's count, its head left out)."""
    parts = forward_flops(fastconformer_config(cfg), frames)
    return sum(v for k, v in parts.items() if k != "head"), stage_sizes(frames)[-1]


def _lstm_flops(cfg: TransducerConfig, frames: int) -> tuple[float, int]:
    """Forward FLOPs of the LSTM encoder over ``frames`` input frames, and its output frames."""
    h = cfg.enc_hidden
    t1 = -(-frames // cfg.frame_stack)
    t2 = -(-t1 // cfg.time_stack)
    step = 2 * 4 * h  # per input or recurrent unit of one step: 4 gates, 2 FLOPs per multiply-add
    pre = step * (cfg.frame_stack * cfg.input_dim + h) + (cfg.enc_pre_layers - 1) * step * 2 * h
    post = step * (cfg.time_stack * h + h) + (cfg.enc_post_layers - 1) * step * 2 * h
    return t1 * pre + t2 * post, t2


def flops(cfg: TransducerConfig, frames: int, labels: int) -> float:
    """Forward FLOPs (2 per multiply-add) of one utterance of ``frames`` input frames and ``labels``
    labels: the encoder and its projection, the prediction network over labels + 1 steps and its
    projection, the joint's output layer (V tokens and the TDT's durations) over T' x (labels + 1)
    positions, the auxiliary CTC head over T' frames where there is one (``ctc_weight`` > 0). Element-wise
    work (tanh, the additions, normalization, softmax), embeddings and biases are not counted."""
    enc, t = {"conformer": _conformer_flops, "lstm": _lstm_flops, "fastconformer": _fastconformer_flops}[cfg.encoder](
        cfg, frames)
    width = cfg.enc_hidden if cfg.encoder == "lstm" else cfg.d_model
    p, j, u = cfg.pred_dim, cfg.joint_dim, labels + 1
    if cfg.pred == "lstm":
        pred = cfg.pred_layers * 2 * 4 * p * 2 * p
    else:
        pred = 2 * p * cfg.context_size if cfg.context_size > 1 else 0
    ctc = 2 * j * cfg.num_classes * t if cfg.ctc_weight > 0 else 0
    return float(enc + 2 * width * j * t + u * (pred + 2 * p * j) + t * u * 2 * j * outputs(cfg) + ctc)


@register_model("transducer", TransducerConfig)
def build_transducer(cfg: TransducerConfig) -> Transducer:
    return Transducer(cfg)


def durations_of(cfg: TransducerConfig) -> tuple[int, ...]:
    """The TDT's durations (``model.durations`` parsed); () for a plain RNN-T. Assumes a valid config."""
    return tuple(int(d) for d in cfg.durations.split(",")) if cfg.durations.strip() else ()


def outputs(cfg: TransducerConfig) -> int:
    """The joint's output width: the V token logits, then one logit per TDT duration."""
    return cfg.num_classes + len(durations_of(cfg))


def duration_problems(durations: str) -> list[str]:
    """``model.durations``: empty, or distinct integers >= 0 that include 1 (a blank of one frame)."""
    if not durations.strip():
        return []
    try:
        ds = [int(d) for d in durations.split(",")]
    except ValueError:
        ds = []
    if not ds or len(set(ds)) != len(ds) or min(ds) < 0 or 1 not in ds:
        return [f"model.durations={durations!r} must be comma-separated distinct integers >= 0 including 1 "
                "(e.g. \"0,1,2,3,4\"), or empty for RNN-T"]
    return []
