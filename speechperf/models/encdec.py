"""An attention encoder-decoder (AED, Canary's layout: NeMo's ``EncDecMultiTaskModel``): the
FastConformer encoder (models/fastconformer.py's, without a head) and a Transformer decoder that
reads the labels so far and attends to the encoder frames; registered as ``aed`` (this module is
``encdec``: ``objectives/aed.py`` is its objective's: label-smoothed cross-entropy, teacher forcing,
greedy and beam decoding).

- **Decoder** (``dec_layers`` layers of width ``d_model``, pre-LN): causal self-attention over the
  label positions, cross-attention to the encoder frames (padding frames masked), a ReLU
  feed-forward of ``dec_ff_mult`` x d_model, each a residual branch with dropout; a final LayerNorm
  and a linear output over ``num_classes``, its weight the token embedding's (``tie_embeddings``,
  as NeMo's; initialized N(0, 1/d_model) so that the tied logits start of order 1). Positions are
  sinusoidal (Vaswani et al.), added to the token embedding times sqrt(d_model): no parameters.
- **Units**: the run's units as they are (``num_classes``: the blank at 0 included). Index 0, the
  blank, is never a label, so the decoder uses it as its one boundary symbol: the start symbol
  (BOS) it reads first and the end symbol (EOS) it emits last (ESPnet shares one symbol for both
  the same way). A label sequence y of U labels is read as ``0 y1..yU`` and trained to emit
  ``y1..yU 0``; positions past U + 1 are padding, ignored by the loss, and the self-attention's
  causality keeps them from changing the valid positions.

:meth:`AED.forward` returns the encoder output (B, T', d_model) as a transducer's does (not
log-probabilities); the objective calls :meth:`AED.decode`. Lengths, ``plan`` and the rule that
``forward`` never reads device values on the host are the contract's (models/contract.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from speechperf.corpus.alphabet import NUM_SYMBOLS
from speechperf.models import register_model
from speechperf.models.conformer import rate_problems, shape_problems
from speechperf.models.contract import AcousticModel
from speechperf.models.dropout import Dropout
from speechperf.models.fastconformer import FastConformerEncoder, encoder_parameters, forward_flops, stage_sizes

BOUNDARY = 0  # the blank's index: the decoder's start symbol (BOS) and end symbol (EOS)


@dataclass(frozen=True)
class AEDConfig:
    """An attention encoder-decoder; the defaults: NeMo's FastConformer small encoder (d_model 176,
    16 blocks) and a 4-layer decoder of its width."""

    objective = "aed"  # not a field: the objective its output is made for (speechperf/objectives)
    name: str = "aed"  # registry key in speechperf.models.MODELS
    input_dim: int = 80  # feature columns read: the 80 log-mel (not the 13 MFCC after them)
    num_classes: int = NUM_SYMBOLS  # output units incl. index 0 (the blank: here BOS and EOS); bpe:N gives N + 1
    # the encoder: models/fastconformer.py's FastConformerConfig fields and meanings
    d_model: int = 176  # width of the encoder's and the decoder's residual streams
    layers: int = 16  # encoder Conformer blocks
    heads: int = 4  # encoder attention heads (d_model / heads must be even: RoPE rotates pairs)
    conv_kernel: int = 9  # encoder depthwise convolution width (subsampled frames); odd
    ff_mult: int = 4  # encoder feed-forward hidden width = ff_mult x d_model
    subsampling_channels: int = 256  # channels of the three dw_striding subsampling stages
    dropout: float = 0.1  # encoder: after the front end, every residual branch and FF hidden layer
    attention_dropout: float = 0.1  # encoder: dropout on the attention weights
    activation_checkpointing: bool = False  # encoder: recompute each block's activations in the backward pass
    # the decoder
    dec_layers: int = 4  # Transformer decoder layers
    dec_heads: int = 4  # decoder attention heads (self and cross); d_model % dec_heads == 0
    dec_ff_mult: int = 4  # decoder feed-forward hidden width = dec_ff_mult x d_model
    dec_dropout: float = 0.1  # decoder: on the embedding, every residual branch and the FF hidden layer
    tie_embeddings: bool = True  # the output layer's weight is the token embedding's (NeMo's Canary: tied)
    label_smoothing: float = 0.1  # the cross-entropy's smoothing (NeMo's Canary: 0.1)
    length_penalty: float = 1.0  # beam search: a hypothesis' log-probability / its length ** this (0: none)
    decode_ratio: float = 2.0  # decoding stops after ceil(decode_ratio x encoder frames) + 1 tokens at most

    def problems(self) -> list[str]:
        """One message per invalid value, naming ``model.FIELD=value``."""
        out = shape_problems(self) + rate_problems(self)
        out += [f"model.{k}={getattr(self, k)} must be >= 1" for k in ("dec_layers", "dec_heads", "dec_ff_mult")
                if getattr(self, k) < 1]
        if self.dec_heads >= 1 and self.d_model % self.dec_heads:
            out.append(f"model.dec_heads={self.dec_heads} must divide model.d_model={self.d_model}")
        for field in ("dec_dropout", "label_smoothing"):
            if not 0.0 <= getattr(self, field) < 1.0:
                out.append(f"model.{field}={getattr(self, field)} not in [0, 1)")
        if self.length_penalty < 0:
            out.append(f"model.length_penalty={self.length_penalty} must be >= 0")
        if self.decode_ratio <= 0:
            out.append(f"model.decode_ratio={self.decode_ratio} must be > 0")
        return out


def sinusoids(length: int, width: int, device: torch.device) -> torch.Tensor:
    """(length, width) sinusoidal positions: sin on even columns, cos on odd (Vaswani et al. 2017)."""
    pos = torch.arange(length, device=device, dtype=torch.float32)[:, None]  # (U, 1)
    rate = torch.exp(torch.arange(0, width, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / width))
    out = torch.zeros(length, width, device=device)
    out[:, 0::2] = torch.sin(pos * rate)
    out[:, 1::2] = torch.cos(pos * rate[: width // 2])
    return out


def heads_of(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, N, D) -> (B, H, N, D / H)."""
    b, n, d = x.shape
    return x.view(b, n, heads, d // heads).transpose(1, 2)


def merged(x: torch.Tensor) -> torch.Tensor:
    """(B, H, N, Dh) -> (B, N, H Dh)."""
    b, h, n, dh = x.shape
    return x.transpose(1, 2).reshape(b, n, h * dh)


class DecoderLayer(nn.Module):
    """Pre-LN: y + SelfAttn(LN(y)) (causal), + CrossAttn(LN(y), memory), + FF(LN(y)); dropout on each branch."""

    def __init__(self, cfg: AEDConfig):
        super().__init__()
        d, ff = cfg.d_model, cfg.dec_ff_mult * cfg.d_model
        self.heads = cfg.dec_heads
        self.self_norm, self.self_qkv, self.self_out = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.cross_norm, self.cross_q = nn.LayerNorm(d), nn.Linear(d, d)
        self.cross_kv, self.cross_out = nn.Linear(d, 2 * d), nn.Linear(d, d)
        self.ff_norm, self.ff_in, self.ff_out = nn.LayerNorm(d), nn.Linear(d, ff), nn.Linear(ff, d)
        self.drop = Dropout(cfg.dec_dropout)

    def forward(self, y: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """y: (B, U, D) positions, memory: (B, T', D) encoder frames, mask: (B, 1, 1, T') True where
        a frame is valid -> (B, U, D)."""
        q, k, v = self.self_qkv(self.self_norm(y)).chunk(3, dim=-1)  # (B, U, D) each
        a = F.scaled_dot_product_attention(heads_of(q, self.heads), heads_of(k, self.heads),
                                           heads_of(v, self.heads), is_causal=True)  # (B, H, U, Dh)
        y = y + self.drop(self.self_out(merged(a)))
        k, v = self.cross_kv(memory).chunk(2, dim=-1)  # (B, T', D) each
        q = self.cross_q(self.cross_norm(y))
        a = F.scaled_dot_product_attention(heads_of(q, self.heads), heads_of(k, self.heads),
                                           heads_of(v, self.heads), attn_mask=mask)  # (B, H, U, Dh)
        y = y + self.drop(self.cross_out(merged(a)))
        return y + self.drop(self.ff_out(self.drop(F.relu(self.ff_in(self.ff_norm(y))))))


class AED(AcousticModel):
    """FastConformer encoder -> (B, T', d_model); Transformer decoder -> logits (B, U, num_classes)."""

    min_frames = 1  # the encoder's: one frame gives one output frame per stage

    def __init__(self, cfg: AEDConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = FastConformerEncoder(cfg)
        self.embed = nn.Embedding(cfg.num_classes, cfg.d_model)
        nn.init.normal_(self.embed.weight, std=cfg.d_model ** -0.5)  # tied: logits of order 1 at initialization
        self.embed_drop = Dropout(cfg.dec_dropout)
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.dec_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.num_classes)
        if cfg.tie_embeddings:
            self.out.weight = self.embed.weight  # one parameter: (num_classes, d_model)

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """Encoder frames for input frames ``lengths`` (CPU arithmetic)."""
        return self.encoder.output_lengths(lengths)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, **planned) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (B, T, 93) features, lengths: (B,) -> encoder output (B, T', d_model), out lengths (B,)."""
        return self.encoder.encode(x, lengths)

    def decode(self, tokens: torch.Tensor, memory: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """tokens: (B, U) inputs (BOS first), memory: (B, T', D), valid: (B, T') bool frames ->
        logits (B, U, num_classes): position u's prediction of the token after tokens[:, u]."""
        scale = math.sqrt(self.cfg.d_model)  # the embedding x sqrt(d_model) (Vaswani et al.): positions of order 1
        y = self.embed(tokens) * scale + sinusoids(tokens.shape[1], self.cfg.d_model, tokens.device).to(memory.dtype)
        y = self.embed_drop(y)
        mask = valid[:, None, None, :]  # (B, 1, 1, T')
        for layer in self.decoder:
            y = layer(y, memory, mask)
        return self.out(self.final_norm(y))


@register_model("aed", AEDConfig)
def build_aed(cfg: AEDConfig) -> AED:
    return AED(cfg)


def decoder_parameters(cfg: AEDConfig) -> int:
    """The decoder's parameters: embedding, layers (three LayerNorms, self and cross attention,
    feed-forward, with biases), final LayerNorm, output (its bias only where tied)."""
    d, ff, v = cfg.d_model, cfg.dec_ff_mult * cfg.d_model, cfg.num_classes
    layer = 3 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * d + d) + (2 * d * d + 2 * d) + (d * d + d) + \
        (d * ff + ff) + (ff * d + d)
    return v * d + cfg.dec_layers * layer + 2 * d + (0 if cfg.tie_embeddings else v * d) + v


def parameter_count(cfg: AEDConfig, classes: int | None = None) -> int:
    """Trainable parameters by formula: the FastConformer encoder and the decoder (``classes``: its
    vocabulary in place of ``cfg.num_classes``)."""
    return encoder_parameters(cfg) + decoder_parameters(replace(cfg, num_classes=classes or cfg.num_classes))


def flops(cfg: AEDConfig, frames: int, labels: int) -> float:
    """Forward FLOPs (2 per multiply-add, matrix products and convolutions only) of one utterance of
    ``frames`` input frames and ``labels`` labels (the decoder reads labels + 1 positions): the
    encoder, then per decoder layer the self-attention's projections and q.k, p.v over U x U, the
    cross-attention's query and output projections over U, its key and value projections over T',
    q.k and p.v over U x T', the feed-forward; the output layer over U."""
    enc = forward_flops(cfg, frames)
    t, u, d, ff = stage_sizes(frames)[-1], labels + 1, cfg.d_model, cfg.dec_ff_mult * cfg.d_model
    layer = (2 * u * d * 3 * d + 2 * u * d * d + 4 * u * u * d  # self-attention
             + 2 * u * d * d + 2 * t * d * 2 * d + 2 * u * d * d + 4 * u * t * d  # cross-attention
             + 2 * 2 * u * d * ff)  # feed-forward
    return float(sum(v for k, v in enc.items() if k != "head") + cfg.dec_layers * layer + 2 * u * d * cfg.num_classes)
