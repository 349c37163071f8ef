import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from speechperf.config import load_preset
from speechperf.models import MODELS, build_model, describe
from speechperf.models.conformer import (FUSED_ALIGN, Conformer, ConformerConfig, SelfAttention, attend, cpu_attention,
                                         rotary, rotate)
from speechperf.models.dropout import cpu_mask
from speechperf.models.contract import TooShortError

SMALL = dict(d_model=32, layers=2, heads=4, conv_kernel=7, subsampling_channels=8, dropout=0.0)


def small(**kw) -> Conformer:
    torch.manual_seed(0)
    return build_model(ConformerConfig(**{**SMALL, **kw}))


def test_registered_with_its_config():
    assert MODELS.lookup("conformer").config is ConformerConfig
    assert isinstance(build_model(ConformerConfig(**SMALL)), Conformer)


@pytest.mark.parametrize("factor", [2, 4, 8])
def test_output_lengths_are_the_convolutions_own(factor):
    """output_lengths() against stride-2 k3 p1 Conv2d stacks, and against the forward pass
    of each length alone (its T' is what the convolutions produced)."""
    stack = nn.Sequential(*[nn.Conv2d(1, 1, 3, stride=2, padding=1) for _ in range({2: 1, 4: 2, 8: 3}[factor])])
    model = small(subsampling=factor).eval()
    lengths = torch.arange(1, 60)
    expected = torch.tensor([stack(torch.zeros(1, 1, int(n), 80)).shape[2] for n in lengths])
    assert torch.equal(model.output_lengths(lengths), expected)
    for n in (1, 2, 3, 7, 8, 9, 33):
        lp, out = model(torch.randn(1, n, 93), torch.tensor([n]))
        assert lp.shape == (int(expected[n - 1]), 1, 30) and out.tolist() == [int(expected[n - 1])]
    assert model.output_lengths(torch.tensor([100]))[0] == {2: 50, 4: 25, 8: 13}[factor]


def test_shapes_and_log_probabilities():
    model = small().eval()
    lp, out = model(torch.randn(3, 50, 93), torch.tensor([50, 30, 11]))
    assert lp.shape == (13, 3, 30) and lp.dtype == torch.float32
    assert out.tolist() == [13, 8, 3]
    assert torch.allclose(lp.exp().sum(-1), torch.ones(13, 3), atol=1e-5)
    out_plan, planned = model.plan(torch.tensor([50, 30, 11]), 50)
    assert out_plan.tolist() == [13, 8, 3] and planned == {}


@pytest.mark.parametrize("factor", [4, 8])
def test_an_utterance_alone_and_in_a_padded_batch_give_the_same_log_probs(factor):
    """Garbage in the padding, other utterances beside it: the valid output frames of each
    utterance equal those of the utterance alone (eval mode)."""
    model = small(subsampling=factor, layers=3).eval()
    lengths = torch.tensor([37, 64, 23, 1])
    x = torch.full((4, 70, 93), 1e3)  # padding of 1000s: any leak is visible
    for b, n in enumerate(lengths.tolist()):
        x[b, :n] = torch.randn(n, 93)
    with torch.no_grad():
        lp, out = model(x, lengths)
        for b, n in enumerate(lengths.tolist()):
            alone, alone_out = model(x[b: b + 1, :n], lengths[b: b + 1])
            assert alone_out[0] == out[b] == alone.shape[0]
            assert torch.allclose(lp[: out[b], b], alone[:, 0], atol=1e-5), f"utterance {b} changed by padding"


def test_reads_the_log_mel_columns_only():
    model = small().eval()
    x = torch.randn(2, 40, 93)
    y = x.clone()
    y[..., 80:] = torch.randn(2, 40, 13)  # other MFCC
    lens = torch.tensor([40, 33])
    assert torch.equal(model(x, lens)[0], model(y, lens)[0])
    y[..., 79] += 1.0  # the last log-mel column does count
    assert not torch.allclose(model(x, lens)[0], model(y, lens)[0])


def test_conformer_preset_is_nemo_small_with_its_parameter_count():
    """d_model 176, 16 blocks, 4 heads, kernel 31 (NeMo's Conformer-CTC small; NeMo counts
    ~13 M with its Transformer-XL position weights, which RoPE does not need)."""
    cfg = load_preset("conformer").model
    assert cfg == ConformerConfig()  # the defaults are NeMo small too
    assert (cfg.d_model, cfg.layers, cfg.heads, cfg.conv_kernel, cfg.ff_mult, cfg.subsampling) == (176, 16, 4, 31, 4, 4)
    d, k, c = 176, 31, 176
    ln = 2 * d
    ff = ln + (d * 4 * d + 4 * d) + (4 * d * d + d)
    attn = ln + (d * 3 * d + 3 * d) + (d * d + d)
    conv = ln + (d * 2 * d + 2 * d) + (d * k + d) + ln + (d * d + d)
    block = 2 * ff + attn + conv + ln
    sub = (9 * c + c) + (c * c * 9 + c) + (c * 20 * d + d)  # 80 mel bins -> 40 -> 20
    head = d * 30 + 30
    assert sum(p.numel() for p in build_model(cfg).parameters()) == 16 * block + sub + head == 12_476_670
    assert describe(cfg) == {"model": "conformer", "params": 12_476_670}


def test_algoperf_sizes_preset():
    cfg = load_preset("conformer-algoperf-sizes").model
    assert (cfg.d_model, cfg.layers, cfg.heads, cfg.conv_kernel, cfg.ff_mult) == (512, 4, 8, 5, 4)
    assert describe(cfg)["params"] == 31_812_638


def test_gradients_reach_every_parameter():
    model = small().train()
    x, lens = torch.randn(2, 60, 93), torch.tensor([60, 41])
    lp, out = model(x, lens)
    labels, label_lens = torch.randint(1, 30, (9,)), torch.tensor([5, 4])
    F.ctc_loss(lp, labels, out, label_lens).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_too_short_input_is_refused():
    model = small()
    with pytest.raises(TooShortError, match="0 frames"):
        model.plan(torch.tensor([5, 0]), 5)
    with pytest.raises(TooShortError, match="conformer"):
        model(torch.zeros(2, 5, 93), torch.tensor([5, 0]))


def test_forward_reads_no_values_on_the_host():
    """On the meta device tensors have shapes but no values: any .item(), bool() or
    value-sized indexing would fail here."""
    with torch.device("meta"):
        model = build_model(ConformerConfig(**SMALL))
        lp, out = model(torch.empty(3, 50, 93), torch.empty(3, dtype=torch.long))
    assert lp.shape == (13, 3, 30) and out.shape == (3,)


def test_bf16_autocast_on_cpu():
    model = small().eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, _ = model(torch.randn(2, 40, 93), torch.tensor([40, 20]))
    assert lp.dtype == torch.float32 and torch.isfinite(lp).all()


def test_rotary_scores_depend_on_distance_only():
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    cos, sin = rotary(20, 8, torch.device("cpu"))

    def score(i, j):
        return (rotate(q, cos[i: i + 1], sin[i: i + 1]) * rotate(k, cos[j: j + 1], sin[j: j + 1])).sum()

    assert torch.allclose(score(3, 7), score(12, 16), atol=1e-5)
    assert not torch.allclose(score(3, 7), score(3, 9), atol=1e-3)
    assert torch.allclose(score(0, 0), (q * k).sum(), atol=1e-6)  # angle 0: no rotation


@pytest.mark.parametrize("field,value,match", [
    ("d_model", 30, r"model\.d_model=30 must be an even multiple of model\.heads=4"),
    ("heads", 0, r"model\.heads=0 must be >= 1"),
    ("conv_kernel", 4, r"model\.conv_kernel=4 must be odd"),
    ("subsampling", 3, r"model\.subsampling=3 must be one of 2, 4, 8"),
    ("input_dim", 94, r"model\.input_dim=94 must be in 1\.\.93"),
    ("dropout", 1.0, r"model\.dropout=1\.0 not in \[0, 1\)"),
    ("attention_dropout", -0.1, r"model\.attention_dropout=-0\.1 not in \[0, 1\)"),
    ("num_classes", 1, r"model\.num_classes=1 must be >= 2"),
])
def test_problems_name_the_field_and_value(field, value, match):
    import re

    problems = ConformerConfig(**{field: value}).problems()
    assert len(problems) == 1 and re.search(match, problems[0]), problems
    assert ConformerConfig().problems() == []


def test_cpu_preset_is_small_with_narrow_subsampling():
    """The CPU demo's Conformer: 4x subsampling (8x leaves the corpus's ~5 frames per label
    fewer output frames than labels) through 16-channel convolutions (d_model channels
    cost more than every block on a CPU), no dropout on the attention weights (unfused SDPA)."""
    cfg = load_preset("conformer-cpu").model
    assert (cfg.d_model, cfg.layers, cfg.subsampling, cfg.subsampling_channels) == (176, 4, 4, 16)
    assert (cfg.dropout, cfg.attention_dropout) == (0.1, 0.0)
    assert describe(cfg)["params"] == 2_945_758
    model = build_model(cfg)
    assert model.output_lengths(torch.tensor([500]))[0] == 125 > 100  # 5 frames per label: 100 labels fit
    assert Conformer(ConformerConfig(subsampling=8, **SMALL)).output_lengths(torch.tensor([500]))[0] == 63


def qkv_and_mask(dh: int, dtype: torch.dtype, lengths=(13, 7, 1)):
    """q, k, v (B, 2, T, dh) needing gradients; the key mask of odd lengths, one of a single frame."""
    g = torch.Generator().manual_seed(0)
    t = max(lengths)
    q, k, v = (torch.randn(len(lengths), 2, t, dh, generator=g, dtype=dtype).requires_grad_() for _ in range(3))
    return q, k, v, torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("dh", [44, 6])
def test_head_dim_padding_changes_neither_output_nor_gradients(dtype, tol, dh):
    q, k, v, mask = qkv_and_mask(dh, dtype)
    grad_out = torch.randn(q.shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
    got = {}
    for pad in (False, True):
        h = attend(q, k, v, mask, 0.0, pad=pad)
        got[pad] = (h, *torch.autograd.grad(h, (q, k, v), grad_out))
    assert got[True][0].shape == q.shape  # sliced back to dh
    for plain, padded in zip(got[False], got[True]):
        torch.testing.assert_close(padded, plain, rtol=tol, atol=tol)
    assert got[True][2][:, :, 1:].abs().max() > 0 and (got[True][2][1, :, 7:] == 0).all()  # masked keys: no gradient


def test_head_dim_padding_with_dropout_draws_the_same_weights():
    """Dropout on the attention weights (T x T per head) draws the same mask padded or not."""
    q, k, v, mask = qkv_and_mask(44, torch.float64)
    outs = []
    for pad in (False, True):
        torch.manual_seed(3)
        outs.append(attend(q, k, v, mask, 0.5, pad=pad))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-12, atol=1e-12)
    torch.manual_seed(4)
    assert not torch.allclose(attend(q, k, v, mask, 0.5, pad=True), outs[0])  # the seed does matter


def test_attention_dropout_on_a_cpu_drops_speechperfs_mask_from_sdpas_weights():
    """On a CPU the weights dropped in training are SDPA's softmax (the same scores and key mask)
    times models/dropout.py's mask from the run's generator, not torch's dropout (whose CPU draws
    follow the CPU's maker); without dropout attend is SDPA's call."""
    q, k, v, mask = qkv_and_mask(12, torch.float64)
    keys = mask[:, None, None, :]  # (B, 1, 1, T)
    scores = (q @ k.transpose(-2, -1) / 12 ** 0.5).masked_fill(~keys, float("-inf"))
    torch.testing.assert_close(scores.softmax(-1) @ v, F.scaled_dot_product_attention(q, k, v, attn_mask=keys))
    torch.manual_seed(5)
    got = attend(q, k, v, mask, 0.25)
    torch.manual_seed(5)
    drop = cpu_mask(torch.Size((*q.shape[:3], q.shape[2])), 0.25, torch.float64)  # (B, H, T, T)
    assert 0.15 < (drop == 0).double().mean() < 0.35
    torch.testing.assert_close(got, (scores.softmax(-1) * drop) @ v, rtol=1e-12, atol=1e-12)
    torch.manual_seed(5)
    assert torch.equal(cpu_attention(q, k, v, keys, 0.25), got)
    assert torch.equal(attend(q, k, v, mask, 0.0), F.scaled_dot_product_attention(q, k, v, attn_mask=keys))


def test_attention_on_a_cpu_is_the_unpadded_call_bit_for_bit():
    """On a CPU nothing is padded: SelfAttention gives what one plain SDPA call with the (B, 1, 1, T)
    boolean mask gives, bit for bit (the CPU reference curves depend on it; padded, these shapes
    differ in the last bits)."""
    cfg = ConformerConfig(**{**SMALL, "d_model": 24, "heads": 2})  # Dh 12: a case the CUDA rule would pad
    assert (cfg.d_model // cfg.heads) % FUSED_ALIGN != 0
    torch.manual_seed(0)
    attn = SelfAttention(cfg).eval()
    x, mask = torch.randn(3, 11, 24), torch.arange(11)[None, :] < torch.tensor([11, 6, 1])[:, None]
    cos, sin = rotary(11, 12, torch.device("cpu"))
    qkv = attn.qkv(attn.norm(x)).reshape(3, 11, 3, 2, 12).permute(2, 0, 3, 1, 4)  # (3, B, H, T, Dh)
    h = F.scaled_dot_product_attention(rotate(qkv[0], cos, sin), rotate(qkv[1], cos, sin), qkv[2],
                                       attn_mask=mask[:, None, None, :])
    want = attn.proj(h.transpose(1, 2).reshape(3, 11, 24))
    assert torch.equal(attn(x, mask, cos, sin), want)


@pytest.mark.cuda
def test_on_cuda_the_padded_bf16_attention_can_use_a_fused_kernel():
    """The conformer preset's shapes (Dh 44, dropout 0.1, a (B, 1, 1, T) boolean mask) in bf16: torch's
    own dispatch checks refuse the memory-efficient kernel unpadded and accept it padded to 48; the
    padded result matches the unpadded one (math path, fp32) to bf16 rounding."""
    from torch.backends.cuda import SDPAParams, can_use_efficient_attention
    q, k, v, mask = (t.cuda() for t in qkv_and_mask(44, torch.float32, lengths=(120, 77, 5)))
    mask4 = mask[:, None, None, :]
    low = [t.detach().bfloat16() for t in (q, k, v)]
    padded = [F.pad(t, (0, 4)) for t in low]
    assert not can_use_efficient_attention(SDPAParams(*low, mask4, 0.1, False, False))
    assert can_use_efficient_attention(SDPAParams(*padded, mask4, 0.1, False, False))
    got = attend(*low, mask, 0.0).float()
    torch.testing.assert_close(got, attend(q, k, v, mask, 0.0, pad=False).detach(), rtol=3e-2, atol=3e-2)
