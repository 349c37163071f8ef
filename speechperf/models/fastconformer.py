"""FastConformer-CTC (Rekesh et al. 2023, arXiv 2305.05084; NeMo's ``ConformerEncoder`` with
``subsampling: dw_striding``, the encoder of Parakeet and Canary).

8x subsampling by three stride-2 3x3 Conv2d stages over (time, frequency), NeMo's
``dw_striding``: a full convolution from the one input channel, then two depthwise (3x3,
``groups`` = channels) + pointwise (1x1) pairs, ReLU after each stage, then a linear map of
channels x frequency to d_model; then Conformer blocks (macaron half-step feed-forwards of
4 x d_model, self-attention, a convolution module of kernel 9, pre-LN, a final LayerNorm) and a
linear CTC head with log-softmax. The blocks are :mod:`speechperf.models.conformer`'s own
(``ConformerBlock``: RoPE attention, LayerNorm in the convolution module, padding masked
before every convolution), so a FastConformer and a Conformer of one width differ only in the
front end and the sizes.

Where it is not NeMo's model, and what that costs in parameters (``nemo_parameter_count``):
positions are RoPE, not Transformer-XL relative attention, so each block lacks NeMo's
``linear_pos`` (d_model^2) and its two positional biases (2 x d_model); the convolution module
normalizes with LayerNorm, not BatchNorm (the same parameter count). The presets' head is NeMo's:
1,024 BPE pieces + blank (``loader.units = "bpe:1024"``); characters do not fit 8x subsampling
(12.5 frames a second against LibriSpeech's ~15 characters).

:meth:`FastConformer.encode` gives the encoder's output (B, T', d_model) without the head,
for a head other than CTC's (a transducer's joint). ``activation_checkpointing`` recomputes
each block's activations in the backward pass instead of keeping them (torch.utils.checkpoint,
non-reentrant; the RNG state is restored, so dropout draws the same masks): one block's
activations alive at a time, at about one more forward pass of compute.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from speechperf.corpus.alphabet import NUM_SYMBOLS
from speechperf.models import register_model
from speechperf.models.contract import AcousticModel
from speechperf.models.conformer import ConformerBlock, halve, rate_problems, rotary, shape_problems, valid_frames
from speechperf.models.dropout import Dropout

STAGES = 3  # stride-2 stages of the front end: 8x in time
NEMO_VOCABULARY = 1024  # the SentencePiece vocabulary of NeMo's English FastConformer and Parakeet CTC models


@dataclass(frozen=True)
class FastConformerConfig:
    """A FastConformer-CTC; the defaults are NeMo's FastConformer small (d_model 176, 16 blocks)."""

    name: str = "fastconformer"  # registry key in speechperf.models.MODELS
    input_dim: int = 80  # feature columns read: the 80 log-mel (not the 13 MFCC after them)
    d_model: int = 176  # width of the residual stream
    layers: int = 16  # Conformer blocks
    heads: int = 4  # attention heads (d_model / heads must be even: RoPE rotates pairs)
    conv_kernel: int = 9  # depthwise convolution width in (subsampled) frames; odd (NeMo's FastConformer: 9)
    ff_mult: int = 4  # feed-forward hidden width = ff_mult x d_model
    subsampling_channels: int = 256  # channels of the three subsampling stages (NeMo: 256)
    dropout: float = 0.1  # dropout after the front end, on every residual branch and the FF hidden layer
    attention_dropout: float = 0.1  # dropout on the attention weights (NeMo's dropout_att); on a CPU it takes
    # SDPA off its fused path: the (B, H, T', T') weights are then kept for the backward pass
    activation_checkpointing: bool = False  # recompute each block's activations in the backward pass
    num_classes: int = NUM_SYMBOLS  # output classes incl. CTC blank: 30 for characters, N + 1 for loader.units=bpe:N

    def problems(self) -> list[str]:
        """One message per invalid value, naming ``model.FIELD=value`` (the Conformer blocks' checks)."""
        return shape_problems(self) + rate_problems(self)


def stage_sizes(size: int) -> list[int]:
    """``size`` after each of the three stride-2 stages: (n - 1) // 2 + 1 each (kernel 3, padding 1)."""
    out = []
    for _ in range(STAGES):
        size = (size - 1) // 2 + 1
        out.append(size)
    return out


class DwStridingSubsampling(nn.Module):
    """NeMo's ``dw_striding``: Conv2d(1, C, 3, 2) + ReLU, then twice depthwise Conv2d(C, C, 3, 2,
    groups=C) + pointwise Conv2d(C, C, 1) + ReLU, then Linear(C x F', d_model)."""

    def __init__(self, cfg: FastConformerConfig):
        super().__init__()
        c = cfg.subsampling_channels
        self.first = nn.Conv2d(1, c, 3, stride=2, padding=1)
        self.depthwise = nn.ModuleList(nn.Conv2d(c, c, 3, stride=2, padding=1, groups=c) for _ in range(STAGES - 1))
        self.pointwise = nn.ModuleList(nn.Conv2d(c, c, 1) for _ in range(STAGES - 1))
        self.out = nn.Linear(c * stage_sizes(cfg.input_dim)[-1], cfg.d_model)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        h = x.unsqueeze(1)  # (B, T, F) -> (B, 1, T, F)
        h = h.masked_fill(~valid_frames(lengths, h.shape[2])[:, None, :, None], 0.0)  # zeros past the end
        h = F.relu(self.first(h))  # (B, C, T/2, F/2)
        for dw, pw in zip(self.depthwise, self.pointwise):
            lengths = halve(lengths)
            h = h.masked_fill(~valid_frames(lengths, h.shape[2])[:, None, :, None], 0.0)  # the next stage sees zeros
            h = F.relu(pw(dw(h)))  # (B, C, T, F) -> (B, C, T/2, F/2)
        b, c, t, f = h.shape
        return self.out(h.permute(0, 2, 1, 3).reshape(b, t, c * f))  # (B, T', C*F') -> (B, T', D)


class FastConformerEncoder(AcousticModel):
    """dw_striding subsampling -> Conformer blocks: the encoder without a head, (B, T', d_model);
    the CTC model's, the transducer's (models/rnnt.py ``encoder="fastconformer"``) and the
    attention encoder-decoder's (models/aed.py). ``cfg``: any config with FastConformerConfig's
    encoder fields."""

    min_frames = 1  # padding 1 on both sides: one frame gives one output frame per stage

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.subsample = DwStridingSubsampling(cfg)
        self.drop = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(ConformerBlock(cfg) for _ in range(cfg.layers))

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """(L - 1) // 2 + 1 per stride-2 stage: the subsampling convs' own arithmetic."""
        for _ in range(STAGES):
            lengths = halve(lengths)
        return lengths

    def encode(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (B, T, 93) features, lengths: (B,) -> encoder output (B, T', d_model), out lengths (B,)."""
        if lengths.device.type == "cpu":  # a CPU read costs nothing; on a GPU plan() checked it
            self.check_lengths(lengths)
        h = self.drop(self.subsample(x[..., : self.cfg.input_dim], lengths))  # (B, T', D)
        out_lens = self.output_lengths(lengths)
        valid = valid_frames(out_lens, h.shape[1])  # (B, T') on x's device
        cos, sin = rotary(h.shape[1], self.cfg.d_model // self.cfg.heads, h.device)
        recompute = self.cfg.activation_checkpointing and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            h = checkpoint(block, h, valid, cos, sin, use_reentrant=False) if recompute else block(h, valid, cos, sin)
        return h, out_lens

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, **planned) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (B, T, 93) features, lengths: (B,) -> encoder output (B, T', d_model), out lengths (B,)."""
        return self.encode(x, lengths)


class FastConformer(FastConformerEncoder):
    """The encoder -> linear CTC head; meets the model contract (its modules and their order, so
    its initialization, as before the encoder was shared)."""

    def __init__(self, cfg: FastConformerConfig):
        super().__init__(cfg)
        self.head = nn.Linear(cfg.d_model, cfg.num_classes)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, **planned) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (B, T, 93) features, lengths: (B,) -> log-probs (T', B, C), out lengths (B,)."""
        h, out_lens = self.encode(x, lengths)
        logits = self.head(h).transpose(0, 1)  # (B, T', C) -> (T', B, C)
        return logits.float().log_softmax(-1), out_lens


@register_model("fastconformer", FastConformerConfig)
def build_fastconformer(cfg: FastConformerConfig) -> FastConformer:
    return FastConformer(cfg)


def block_parameters(d: int, ff: int, k: int) -> int:
    """One ConformerBlock: two feed-forwards (LayerNorm, d->ff->d), attention (LayerNorm, qkv, out),
    convolution module (LayerNorm, d->2d, depthwise k, LayerNorm, d->d), the final LayerNorm."""
    feed_forward = 2 * d + (d * ff + ff) + (ff * d + d)
    attention = 2 * d + (3 * d * d + 3 * d) + (d * d + d)
    conv = 2 * d + (2 * d * d + 2 * d) + (d * k + d) + 2 * d + (d * d + d)
    return 2 * feed_forward + attention + conv + 2 * d


def parameter_count(cfg: FastConformerConfig, classes: int | None = None) -> int:
    """Trainable parameters of the model ``cfg`` builds, by formula (``classes``: the head's outputs
    in place of ``cfg.num_classes``)."""
    c, d = cfg.subsampling_channels, cfg.d_model
    front = (9 * c + c) + (STAGES - 1) * ((9 * c + c) + (c * c + c)) + (c * stage_sizes(cfg.input_dim)[-1] * d + d)
    head = d * (classes or cfg.num_classes) + (classes or cfg.num_classes)
    return front + cfg.layers * block_parameters(d, cfg.ff_mult * d, cfg.conv_kernel) + head


def encoder_parameters(cfg) -> int:
    """The encoder's parameters (front end and blocks, no head): :class:`FastConformerEncoder`'s."""
    return parameter_count(cfg, classes=1) - (cfg.d_model + 1)


def nemo_parameter_count(cfg: FastConformerConfig, vocabulary: int = NEMO_VOCABULARY) -> int:
    """The parameters of NeMo's FastConformer-CTC at ``cfg``'s sizes: this model's, plus per block
    the Transformer-XL attention's ``linear_pos`` (d^2, no bias) and ``pos_bias_u``/``pos_bias_v``
    (2 d) that RoPE replaces, with a head over ``vocabulary`` tokens + blank (NeMo's ConvASRDecoder)."""
    d = cfg.d_model
    return parameter_count(cfg, classes=vocabulary + 1) + cfg.layers * (d * d + 2 * d)


def forward_flops(cfg: FastConformerConfig, frames: int) -> dict[str, int]:
    """Forward FLOPs (2 per multiply-add, matrix products and convolutions only) of one utterance of
    ``frames`` input frames, by part: ``first`` (the first convolution), ``front`` (the other
    subsampling convolutions and the linear map), ``blocks`` (their linear layers and depthwise
    convolutions), ``attention`` (q.k and p.v) and ``head``."""
    c, d, ff, k = cfg.subsampling_channels, cfg.d_model, cfg.ff_mult * cfg.d_model, cfg.conv_kernel
    times, freqs = stage_sizes(frames), stage_sizes(cfg.input_dim)
    t = times[-1]
    front = sum(2 * 9 * c * ti * fi + 2 * c * c * ti * fi for ti, fi in zip(times[1:], freqs[1:]))
    front += 2 * c * freqs[-1] * d * t
    per_frame = 2 * (2 * 2 * d * ff) + (2 * 3 * d * d + 2 * d * d) + (2 * 2 * d * d + 2 * d * k + 2 * d * d)
    return {"first": 2 * 9 * c * times[0] * freqs[0], "front": front, "blocks": cfg.layers * per_frame * t,
            "attention": cfg.layers * 4 * t * t * d, "head": 2 * d * cfg.num_classes * t}


def training_flops(cfg: FastConformerConfig, frames: int) -> int:
    """Training FLOPs (forward + backward) of one utterance, as :mod:`speechperf.hardware.mfu`
    counts them: every layer's backward twice its forward (input and weight gradients), but the
    first convolution's, whose input needs no gradient (its weight gradient only: once)."""
    parts = forward_flops(cfg, frames)
    return 2 * parts["first"] + 3 * (parts["front"] + parts["blocks"] + parts["attention"] + parts["head"])


def flops_per_audio_second(cfg: FastConformerConfig, seconds: float = 12.4, frame_s: float = 0.01) -> float:
    """Training FLOPs per second of audio for utterances of ``seconds`` (LibriSpeech's mean 12.4 s):
    attention grows with the length, so the figure names it."""
    return training_flops(cfg, int(round(seconds / frame_s))) / seconds

