"""Conformer-CTC (Gulati et al. 2020; NeMo's Conformer-CTC, AlgoPerf's Conformer workload).

2-D convolution subsampling (2, 4 or 8x in time) of the 80 log-mel columns -> N Conformer
blocks (half-step feed-forward, multi-head self-attention, convolution module, half-step
feed-forward, layer norm) -> linear CTC head over the 30-symbol alphabet -> log-softmax.

Positions: rotary embeddings (RoPE, Su et al. 2021) on the queries and keys of every
attention layer. They are relative, as NeMo's Transformer-XL positional attention is (a
score depends on the distance of two frames, not on where the utterance sits), but they
are an elementwise rotation of q and k, so attention stays one
``scaled_dot_product_attention`` call with a boolean key mask (fused kernels on CPU and
GPU; on CUDA the head dimension is zero-padded to a multiple of 8 for them, ``attend``); a
Transformer-XL bias would be a (B, H, T, T) float mask computed per layer, which rules out
the fused kernels and costs T^2 memory.

Padding never changes a sequence's output:
- the subsampling convolutions and every depthwise convolution see zeros past a
  sequence's valid frames (masked right before each of them), as the same sequence alone
  sees the convolution's own zero padding;
- attention masks padded keys (``attn_mask``); padded queries attend to valid keys only,
  so their rows stay finite and are ignored downstream;
- normalization is LayerNorm everywhere (per frame: no statistics across frames, so no
  BatchNorm over padding, no train/eval mismatch on a small corpus).
The masks are built on the device from the lengths (arange < lengths): no host reads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from speechperf.corpus.alphabet import NUM_SYMBOLS
from speechperf.models import register_model
from speechperf.models.contract import AcousticModel
from speechperf.models.dropout import Dropout, dropout

SUBSAMPLING = (2, 4, 8)  # time reduction factors: 1, 2 or 3 stride-2 convolution stages
FEATURE_DIM = 93  # columns of the prepared features (80 log-mel + 13 MFCC)
# CUDA's fused attention kernels need a head dimension divisible by 8 for 16-bit inputs (torch's
# aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, torch 2.11-2.13): memory-efficient
# (check_head_dim_size_mem_efficient: Dh % minimum_gemm_alignment, 8 for fp16/bf16 on sm80+, 4
# for fp32) and cuDNN (check_cudnn_tensor_shapes: Dh % 8). A (B, 1, 1, T) boolean mask passes
# memory-efficient's checks (torch turns it into an additive bias, pads its last dim to 8 and
# broadcasts it); cuDNN also needs dropout in steps of 1/16 (0.1 is not), flash takes no mask.
# Unpadded, Dh 44 (d_model 176, 4 heads) leaves a training step only the unfused math path.
FUSED_ALIGN = 8


@dataclass(frozen=True)
class ConformerConfig:
    """A Conformer-CTC encoder; the defaults are NeMo's Conformer-CTC small (~12.5 M)."""

    name: str = "conformer"  # registry key in speechperf.models.MODELS
    input_dim: int = 80  # feature columns read: the 80 log-mel (not the 13 MFCC after them)
    d_model: int = 176  # width of the residual stream
    layers: int = 16  # Conformer blocks
    heads: int = 4  # attention heads (d_model / heads must be even: RoPE rotates pairs)
    conv_kernel: int = 31  # depthwise convolution width in (subsampled) frames; odd
    ff_mult: int = 4  # feed-forward hidden width = ff_mult x d_model
    subsampling: int = 4  # time reduction of the conv front end: 4 (Conformer), 8 (FastConformer), 2
    subsampling_channels: int = 176  # channels of the subsampling convs (narrow ones are cheap on CPU)
    dropout: float = 0.1  # dropout on every residual branch and the FF hidden layer (models/dropout.py)
    attention_dropout: float = 0.1  # dropout on the attention weights, inside SDPA (NeMo's dropout_att);
    # on a CPU it takes SDPA off its fused path: one attention forward + backward costs 2.5x
    num_classes: int = NUM_SYMBOLS  # output symbols incl. CTC blank (the 30-symbol alphabet)

    def problems(self) -> list[str]:
        """One message per invalid value, naming ``model.FIELD=value``."""
        out = shape_problems(self)
        if self.subsampling not in SUBSAMPLING:
            out.append(f"model.subsampling={self.subsampling} must be one of {', '.join(map(str, SUBSAMPLING))}")
        return out + rate_problems(self)


def shape_problems(cfg) -> list[str]:
    """The Conformer blocks' size checks, shared by every config built of them (this one, the
    FastConformer's): positive sizes, the feature columns, RoPE's even head width, an odd kernel."""
    out = [f"model.{f}={getattr(cfg, f)} must be >= 1" for f in
           ("d_model", "layers", "heads", "ff_mult", "subsampling_channels") if getattr(cfg, f) < 1]
    if not 1 <= cfg.input_dim <= FEATURE_DIM:
        out.append(f"model.input_dim={cfg.input_dim} must be in 1..{FEATURE_DIM} (the feature columns)")
    if cfg.heads >= 1 and (cfg.d_model % cfg.heads or (cfg.d_model // cfg.heads) % 2):
        out.append(f"model.d_model={cfg.d_model} must be an even multiple of model.heads={cfg.heads} "
                   f"(RoPE rotates pairs of each head's dimensions)")
    if cfg.conv_kernel < 1 or cfg.conv_kernel % 2 == 0:
        out.append(f"model.conv_kernel={cfg.conv_kernel} must be odd and >= 1 (same-length convolution)")
    return out


def rate_problems(cfg) -> list[str]:
    """The dropout rates and the output classes of a config built of Conformer blocks."""
    out = [f"model.{f}={getattr(cfg, f)} not in [0, 1)" for f in ("dropout", "attention_dropout")
           if not 0.0 <= getattr(cfg, f) < 1.0]
    if cfg.num_classes < 2:  # config.validate checks it against loader.units (30 for characters)
        out.append(f"model.num_classes={cfg.num_classes} must be >= 2 (the CTC blank and the units)")
    return out


def halve(lengths: torch.Tensor) -> torch.Tensor:
    """Frames after one kernel-3, stride-2, padding-1 convolution: (L - 1) // 2 + 1."""
    return torch.div(lengths - 1, 2, rounding_mode="floor") + 1


def valid_frames(lengths: torch.Tensor, frames: int) -> torch.Tensor:
    """(B, frames) bool, True at the valid frames; built on the lengths' device."""
    return torch.arange(frames, device=lengths.device)[None, :] < lengths[:, None]


class Subsampling(nn.Module):
    """Stride-2 3x3 Conv2d + ReLU stages over (time, frequency), then a linear map to d_model."""

    def __init__(self, cfg: ConformerConfig):
        super().__init__()
        stages = int(math.log2(cfg.subsampling))
        c = cfg.subsampling_channels
        self.convs = nn.ModuleList(nn.Conv2d(1 if i == 0 else c, c, 3, stride=2, padding=1) for i in range(stages))
        freq = cfg.input_dim
        for _ in range(stages):
            freq = (freq - 1) // 2 + 1
        self.out = nn.Linear(c * freq, cfg.d_model)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        h = x.unsqueeze(1)  # (B, T, F) -> (B, 1, T, F)
        for conv in self.convs:
            h = h.masked_fill(~valid_frames(lengths, h.shape[2])[:, None, :, None], 0.0)  # zeros past the end
            h = F.relu(conv(h))  # (B, C, T, F) -> (B, C, T', F')
            lengths = halve(lengths)
        b, c, t, f = h.shape
        return self.out(h.permute(0, 2, 1, 3).reshape(b, t, c * f))  # (B, T', C*F') -> (B, T', D)


def rotary(frames: int, dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (frames, dim / 2) of RoPE's angles pos / 10000^(2i / dim)."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    angles = torch.arange(frames, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on x (..., T, Dh): each pair (x1_i, x2_i) of the two halves rotated by angle (t, i)."""
    x1, x2 = x.chunk(2, dim=-1)  # (..., T, Dh/2) each
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # the activations' dtype (bf16 under autocast)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class FeedForward(nn.Module):
    """LayerNorm -> Linear (x ff_mult) -> SiLU -> dropout -> Linear -> dropout."""

    def __init__(self, cfg: ConformerConfig):
        super().__init__()
        hidden = cfg.ff_mult * cfg.d_model
        self.net = nn.Sequential(nn.LayerNorm(cfg.d_model), nn.Linear(cfg.d_model, hidden), nn.SiLU(),
                                 Dropout(cfg.dropout), nn.Linear(hidden, cfg.d_model), Dropout(cfg.dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor, dropout_p: float,
           pad: bool | None = None) -> torch.Tensor:
    """Scaled dot-product attention of q, k, v (B, H, T, Dh) over the keys ``key_mask`` (B, T) keeps.

    ``pad`` (default: on CUDA where Dh is not a multiple of FUSED_ALIGN) zero-pads the head
    dimension for a fused kernel: q.k and the output's first Dh columns are unchanged (zero
    columns add nothing, the scale stays 1/sqrt(Dh)). Not on a CPU: there the padded GEMMs sum
    in another order (the results would move by rounding) and the fused CPU kernel has no such
    alignment rule. On a CPU, weights dropped in training are dropped by :func:`cpu_attention`."""
    dh = q.shape[-1]
    mask = key_mask[:, None, None, :]  # (B, T) -> (B, 1, 1, T): every query row sees the same keys
    if dropout_p > 0.0 and q.device.type == "cpu":
        return cpu_attention(q, k, v, mask, dropout_p)
    if pad is None:
        pad = q.is_cuda and dh % FUSED_ALIGN != 0
    if not pad:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    extra = -dh % FUSED_ALIGN
    q, k, v = (F.pad(t, (0, extra)) for t in (q, k, v))  # (B, H, T, Dh) -> (B, H, T, Dh + extra)
    h = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=1.0 / math.sqrt(dh))
    return h[..., :dh]  # (B, H, T, Dh + extra) -> (B, H, T, Dh): the padded columns are P @ 0 = 0


def cpu_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                  dropout_p: float) -> torch.Tensor:
    """SDPA's math (softmax of q k^T / sqrt(Dh) over the keys ``mask`` (B, 1, 1, T) keeps, dropout,
    times v) with models/dropout.py's mask on the weights: SDPA's own draws with torch's CPU dropout,
    whose code follows the CPU's maker. q, k, v: (B, H, T, Dh) -> (B, H, T, Dh)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, T)
    weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    return dropout(weights, dropout_p, True) @ v


class SelfAttention(nn.Module):
    """LayerNorm -> multi-head self-attention with RoPE and a key padding mask -> dropout."""

    def __init__(self, cfg: ConformerConfig):
        super().__init__()
        self.heads, self.p = cfg.heads, cfg.attention_dropout
        self.norm = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.drop = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.qkv(self.norm(x)).reshape(b, t, 3, self.heads, d // self.heads)  # (B, T, 3, H, Dh)
        qkv = qkv.permute(2, 0, 3, 1, 4)  # (3, B, H, T, Dh)
        (q, k), v = rotate(qkv[:2], cos, sin), qkv[2]  # q and k rotated in one pass
        h = attend(q, k, v, key_mask, self.p if self.training else 0.0)
        return self.drop(self.proj(h.transpose(1, 2).reshape(b, t, d)))  # (B, H, T, Dh) -> (B, T, D)


class DepthwiseConv1d(nn.Conv1d):
    """The conv module's depthwise convolution, run eagerly under ``train.system.compile``
    (:func:`speechperf.models.contract.compiled` reads ``eager_under_compile``): inductor's
    lowering of a convolution's backward fixes the number of frames (torch 2.13: a guard on T in
    ``convolution_backward_lowering``), so a compiled block would compile again for every batch
    length; run eagerly, the blocks around it keep one graph for every length (tests/models).
    Marked here and disabled there, not decorated: ``torch.compiler.disable`` imports dynamo
    (2 s of every process's start on a 2-core CPU, compiled or not)."""

    eager_under_compile = True


class ConvModule(nn.Module):
    """LayerNorm -> pointwise (2D) + GLU -> depthwise conv -> LayerNorm -> SiLU -> pointwise -> dropout.

    The pointwise convolutions are Linear layers on (B, T, D) (the same map, no transposes);
    the normalization after the depthwise conv is LayerNorm, not BatchNorm: per frame, so
    padding and batch composition never enter it."""

    def __init__(self, cfg: ConformerConfig):
        super().__init__()
        d = cfg.d_model
        self.norm = nn.LayerNorm(d)
        self.pw1 = nn.Linear(d, 2 * d)
        self.dw = DepthwiseConv1d(d, d, cfg.conv_kernel, padding=cfg.conv_kernel // 2, groups=d)
        self.dw_norm = nn.LayerNorm(d)
        self.pw2 = nn.Linear(d, d)
        self.drop = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        h = F.glu(self.pw1(self.norm(x)), dim=-1)  # (B, T, 2D) -> (B, T, D)
        h = h.masked_fill(pad[:, :, None], 0.0)  # the depthwise conv sees zeros past the end
        h = self.dw(h.transpose(1, 2)).transpose(1, 2)  # (B, D, T) -> conv -> (B, T, D)
        return self.drop(self.pw2(F.silu(self.dw_norm(h))))


class ConformerBlock(nn.Module):
    """x + FF/2, + attention, + conv module, + FF/2, then LayerNorm (macaron form)."""

    def __init__(self, cfg: ConformerConfig):
        super().__init__()
        self.ff1, self.attn = FeedForward(cfg), SelfAttention(cfg)  # made in this order: the init draws follow it
        self.conv, self.ff2 = ConvModule(cfg), FeedForward(cfg)
        self.norm = nn.LayerNorm(cfg.d_model)

    def forward(self, x: torch.Tensor, valid: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + 0.5 * self.ff1(x)
        x = x + self.attn(x, valid, cos, sin)
        x = x + self.conv(x, ~valid)
        x = x + 0.5 * self.ff2(x)
        return self.norm(x)


class ConformerLayers:
    """Subsampling -> dropout -> Conformer blocks: features (B, T, F) to (B, T', d_model), what the
    CTC :class:`Conformer` and the transducer's Conformer encoder (models/rnnt.py) share.
    A mixin of an ``nn.Module``, so that the CTC model keeps its parameter names (``subsample``,
    ``blocks``: checkpoints' keys) and its creation order (the same RNG draws at init)."""

    def build_layers(self, cfg: ConformerConfig) -> None:
        """Create the layers, in the order the CTC Conformer always has."""
        self.cfg = cfg
        self.stages = int(math.log2(cfg.subsampling))
        self.subsample = Subsampling(cfg)
        self.drop = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(ConformerBlock(cfg) for _ in range(cfg.layers))

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """(L - 1) // 2 + 1 per stride-2 stage: the subsampling convs' own arithmetic."""
        for _ in range(self.stages):
            lengths = halve(lengths)
        return lengths

    def encode(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (B, T, 93) features, lengths: (B,) -> hidden (B, T', D), out lengths (B,)."""
        h = self.drop(self.subsample(x[..., : self.cfg.input_dim], lengths))  # (B, T', D)
        out_lens = self.output_lengths(lengths)
        valid = valid_frames(out_lens, h.shape[1])  # (B, T') on x's device
        cos, sin = rotary(h.shape[1], self.cfg.d_model // self.cfg.heads, h.device)
        for block in self.blocks:
            h = block(h, valid, cos, sin)
        return h, out_lens


class ConformerEncoder(ConformerLayers, nn.Module):
    """The Conformer's layers alone, a submodule of another model: forward is :meth:`encode`."""

    min_frames = 1  # padding 1 on both sides: one frame gives one output frame per stage

    def __init__(self, cfg: ConformerConfig):
        super().__init__()
        self.build_layers(cfg)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encode(x, lengths)


class Conformer(ConformerLayers, AcousticModel):
    """Subsampling -> Conformer blocks -> linear CTC head; meets the model contract."""

    min_frames = 1  # padding 1 on both sides: one frame gives one output frame per stage

    def __init__(self, cfg: ConformerConfig):
        super().__init__()
        self.build_layers(cfg)
        self.head = nn.Linear(cfg.d_model, cfg.num_classes)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, **planned) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (B, T, 93) features, lengths: (B,) -> log-probs (T', B, C), out lengths (B,)."""
        if lengths.device.type == "cpu":  # a CPU read costs nothing; on a GPU plan() checked it
            self.check_lengths(lengths)
        h, out_lens = self.encode(x, lengths)
        logits = self.head(h).transpose(0, 1)  # (B, T', C) -> (T', B, C)
        return logits.float().log_softmax(-1), out_lens


@register_model("conformer", ConformerConfig)
def build_conformer(cfg: ConformerConfig) -> Conformer:
    return Conformer(cfg)
