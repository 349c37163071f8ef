"""fp8 training (speechperf/models/fp8.py, torchao's float8 emulated on the CPU): the casts' scale,
saturation and rounding against an independent float8 decoder written from the formats' bit layouts,
a Float8Linear's forward and input gradient against the same products computed in plain torch, and
the swap: which layers, which not and why, the state dict unchanged."""
import math

import pytest
import torch
from torch import nn

from speechperf.models import fp8

float8 = fp8.torchao_float8()
from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic  # noqa: E402
from torchao.float8.float8_training_tensor import LinearMMConfig  # noqa: E402
from torchao.float8.float8_utils import to_fp8_saturated  # noqa: E402


def decode(bits: int, exp_bits: int, man_bits: int) -> float:
    """The value of an 8-bit float from its bits (IEEE-like; bias 2^(e-1) - 1; subnormals at
    exponent 0). e4m3fn has no infinity: its only non-finite pattern is S.1111.111 (NaN); e5m2's
    top exponent holds infinities and NaNs as IEEE's."""
    sign = -1.0 if bits >> 7 else 1.0
    e, m = (bits >> man_bits) & ((1 << exp_bits) - 1), bits & ((1 << man_bits) - 1)
    bias, top = (1 << (exp_bits - 1)) - 1, (1 << exp_bits) - 1
    if exp_bits == 4 and e == top and m == (1 << man_bits) - 1 or exp_bits == 5 and e == top and m:
        return math.nan
    if exp_bits == 5 and e == top:
        return sign * math.inf
    if e == 0:
        return sign * m / (1 << man_bits) * 2.0 ** (1 - bias)
    return sign * (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)


FORMATS = {torch.float8_e4m3fn: (4, 3), torch.float8_e5m2: (5, 2)}


def grid(dtype) -> list[tuple[float, int]]:
    """Every finite value of the format with its mantissa's low bit (ties go to the even one)."""
    e, m = FORMATS[dtype]
    return sorted({(decode(b, e, m), b & 1) for b in range(256) if math.isfinite(decode(b, e, m))})


def nearest(x: float, dtype) -> float:
    """``x`` rounded to the nearest finite value of the format, ties to an even mantissa, saturated
    at its largest value (the independent reference of the casts)."""
    values = grid(dtype)
    top = values[-1][0]
    if abs(x) >= top:
        return math.copysign(top, x)
    best = min(abs(v - x) for v, _ in values)
    ties = [(v, odd) for v, odd in values if abs(v - x) == best]
    return min(ties, key=lambda t: t[1])[0]


def test_the_formats_maxima_and_every_bit_pattern_agree_with_torch():
    assert grid(torch.float8_e4m3fn)[-1][0] == fp8.E4M3_MAX == 448.0
    assert grid(torch.float8_e5m2)[-1][0] == fp8.E5M2_MAX == 57344.0
    for dtype, (e, m) in FORMATS.items():
        ours = torch.tensor([decode(b, e, m) for b in range(256)], dtype=torch.float64)
        torch_s = torch.arange(256, dtype=torch.uint8).view(dtype).double()
        assert torch.equal(ours.isnan(), torch_s.isnan())
        assert torch.equal(ours[~ours.isnan()], torch_s[~torch_s.isnan()])  # infinities too (e5m2's)


def test_ties_go_to_the_even_mantissa_and_large_values_saturate():
    e4m3 = torch.float8_e4m3fn
    assert nearest(1.0625, e4m3) == 1.0 and nearest(1.1875, e4m3) == 1.25  # halfway: the even neighbour
    x = torch.tensor([1.0625, 1.1875, 500.0, -1e6, 448.0, 464.0])
    assert to_fp8_saturated(x, e4m3).float().tolist() == [1.0, 1.25, 448.0, -448.0, 448.0, 448.0]
    assert to_fp8_saturated(torch.tensor([1e6, -6e4]), torch.float8_e5m2).float().tolist() == [57344.0, -57344.0]


def test_a_dynamic_cast_scales_amax_to_the_max_and_rounds_as_the_reference():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 32, generator=g).clamp(-3, 3) * 3.0
    x[5, 7] = -11.5  # the amax
    for dtype, top in ((torch.float8_e4m3fn, 448.0), (torch.float8_e5m2, 57344.0)):
        t = hp_tensor_to_float8_dynamic(x, dtype, LinearMMConfig())
        scale = torch.tensor(top / 11.5, dtype=torch.float64).float()  # torchao divides in float64, keeps float32
        assert t._scale.item() == scale.item()
        scaled = (x * scale).tolist()
        want = torch.tensor([[nearest(v, dtype) for v in row] for row in scaled])
        assert torch.equal(t._data.float(), want)
        assert t._data.float()[5, 7].item() == -top  # the amax lands on the format's max
        back = t._data.float() / t._scale  # the round trip: within half a unit in the last place
        e, m = FORMATS[dtype]
        normal = (x * scale).abs() >= 2.0 ** (2 - 2 ** (e - 1))  # the smallest normal: 2^(1 - bias)
        assert normal.float().mean() > 0.9
        rel = ((back - x).abs() / x.abs())[normal].max().item()
        assert 2.0 ** -(m + 2) < rel <= 2.0 ** -(m + 1) * 1.0001  # rounding happened, never past half a step
        sub = 2.0 ** (2 - 2 ** (e - 1) - m)  # the subnormals' step
        assert ((back - x).abs()[~normal] * scale <= sub / 2 * 1.0001).all()


def quantized(x: torch.Tensor, dtype) -> torch.Tensor:
    """x cast to float8 with a dynamic per-tensor scale and back, in plain torch and the reference."""
    top = grid(dtype)[-1][0]
    scale = torch.tensor(top / x.abs().max().item(), dtype=torch.float64).float()
    return torch.tensor([[nearest(v, dtype) for v in row] for row in (x * scale).tolist()]) / scale


def test_a_float8_linear_multiplies_the_cast_values_forward_and_backward():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(32, 16))
    w, b = plain[0].weight.detach().clone(), plain[0].bias.detach().clone()
    fp8.convert(plain, emulate=True)
    layer = plain[0]
    x = torch.randn(8, 32, requires_grad=True)
    y = layer(x)
    e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2
    want = quantized(x.detach(), e4m3) @ quantized(w, e4m3).T + b
    assert torch.allclose(y, want, rtol=1e-6, atol=1e-6)
    go = torch.randn(8, 16)
    y.backward(go)
    want_dx = quantized(go, e5m2) @ quantized(w, e4m3)  # the output's gradient in e5m2, the weight in e4m3
    assert torch.allclose(x.grad, want_dx, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(x.grad, go @ w, rtol=1e-4)  # the casts are real: fp32's product differs


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 64)
        self.attn = nn.MultiheadAttention(32, 4)  # out_proj: a subclass whose weight the attention reads itself
        self.b = nn.Sequential(nn.Linear(64, 30), nn.Linear(30, 16))
        self.c = nn.Linear(48, 16, bias=False)


def test_the_swap_takes_the_aligned_linear_layers_and_says_why_not_for_the_others():
    torch.manual_seed(0)
    model = Mixed()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    layers = fp8.convert(model, emulate=True)
    assert [(l.name, l.shape, l.swapped, l.reason) for l in layers] == [
        ("a", (32, 64), True, ""),
        ("attn.out_proj", (32, 32), False,
         "a NonDynamicallyQuantizableLinear, not an nn.Linear: its owner may use its weight without calling it"),
        ("b.0", (64, 30), False, "out_features 30 not a multiple of 16"),
        ("b.1", (30, 16), False, "in_features 30 not a multiple of 16"),
        ("c", (48, 16), True, "")]
    assert [n for n, m in model.named_modules() if fp8.is_float8(m)] == ["a", "c"]
    assert fp8.swapped(model) == 2
    after = model.state_dict()
    assert after.keys() == before.keys()  # a checkpoint is the plain model's
    assert all(type(v) is torch.Tensor and torch.equal(v, before[k]) for k, v in after.items())  # noqa: E721
    assert fp8.summary(layers) == ("2 of 5 Linear layers in float8, the others in bf16 (attn.out_proj: a "
                                   "NonDynamicallyQuantizableLinear, not an nn.Linear: its owner may use its weight "
                                   "without calling it; b.0: out_features 30 not a multiple of 16; b.1: in_features 30 "
                                   "not a multiple of 16)")


def test_prepare_swaps_only_for_fp8_and_emulates_off_cuda():
    for precision in ("fp32", "bf16"):
        m = nn.Sequential(nn.Linear(16, 16))
        assert fp8.prepare(m, precision, torch.device("cpu")) == [] and fp8.swapped(m) == 0
    m = nn.Sequential(nn.Linear(16, 16))
    fp8.prepare(m, "fp8", torch.device("cpu"))
    assert m[0].config.emulate is True


def test_without_torchao_fp8_is_refused_naming_the_extra(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_torchao(name, *args, **kwargs):
        if name.startswith("torchao"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torchao)
    with pytest.raises(fp8.ConfigError, match=r"needs torchao.*pip install 'speechperf\[fp8\]'"):
        fp8.torchao_float8()
    assert "pip install 'speechperf[fp8]'" in fp8.available()
