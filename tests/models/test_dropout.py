import pytest
import torch
import torch.nn.functional as F

from speechperf.models.dropout import LEVELS, Dropout, cpu_mask, dropout


def reference_mask(shape, p: float, seed: int) -> torch.Tensor:
    """The mask rebuilt from the same generator state one 16-bit draw at a time, in Python."""
    torch.manual_seed(seed)
    n = shape.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(1 << 63), None).tolist()
    draws = []
    for w in words:
        u = w & ((1 << 64) - 1)  # the word's 64 bits; little-endian 16-bit pieces, signed
        for i in range(4):
            piece = (u >> (16 * i)) & 0xFFFF
            draws.append(piece - (1 << 16) if piece >= 1 << 15 else piece)
    drop = round(p * LEVELS)
    scale = LEVELS / (LEVELS - drop)
    return torch.tensor([scale if r >= drop - LEVELS // 2 else 0.0 for r in draws[:n]]).view(shape)


@pytest.mark.parametrize("shape", [(3, 5, 7), (1,), (2, 3)])
def test_mask_is_the_draws_compared_with_the_threshold(shape):
    shape = torch.Size(shape)
    expected = reference_mask(shape, 0.1, seed=3)
    torch.manual_seed(3)
    assert torch.equal(cpu_mask(shape, 0.1, torch.float32), expected.float())


def test_drop_rate_and_expectation_match_torch_dropout():
    torch.manual_seed(0)
    x = torch.ones(400_000)
    for p in (0.1, 0.3):
        ours = dropout(x, p, True)
        theirs = F.dropout(x, p, True)
        assert abs((ours == 0).float().mean().item() - p) < 3e-3
        assert abs(ours.mean().item() - 1.0) < 1e-2 and abs(theirs.mean().item() - 1.0) < 1e-2
        kept = ours[ours != 0]
        assert torch.allclose(kept, torch.full_like(kept, 1 / (1 - round(p * LEVELS) / LEVELS)))


def test_same_seed_same_mask_and_the_run_rng_advances():
    x = torch.randn(64, 33)
    torch.manual_seed(7)
    a, b = dropout(x, 0.1, True), dropout(x, 0.1, True)
    torch.manual_seed(7)
    assert torch.equal(dropout(x, 0.1, True), a) and not torch.equal(a, b)


def test_gradient_is_the_mask():
    torch.manual_seed(1)
    x = torch.randn(8, 16, requires_grad=True)
    y = dropout(x, 0.25, True)
    y.sum().backward()
    mask = torch.where(y != 0, y / x, torch.zeros_like(y))
    assert torch.allclose(x.grad, mask.detach())


def test_identity_when_evaluating_or_p_zero():
    x = torch.randn(4, 4)
    m = Dropout(0.5).eval()
    assert m(x) is x
    assert dropout(x, 0.0, True) is x


def test_keeps_bf16():
    torch.manual_seed(0)
    assert dropout(torch.ones(10, dtype=torch.bfloat16), 0.1, True).dtype == torch.bfloat16


@pytest.mark.parametrize("p", [-0.1, 1.0])
def test_refuses_probabilities_outside_0_1(p):
    with pytest.raises(ValueError, match=str(p)):
        Dropout(p)
