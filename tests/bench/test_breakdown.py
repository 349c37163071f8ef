"""The profiler breakdown groups a step's time by kind of work, depthwise convolutions apart."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from speechperf.bench.breakdown import KINDS, step_breakdown


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Conv1d(1, 16, 3)  # one input channel, not depthwise
        self.depthwise = nn.Conv1d(16, 16, 5, groups=16)
        self.norm = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        h = self.depthwise(self.first(x)).transpose(1, 2)  # (B, 1, T) -> (B, 16, T') -> (B, T', 16)
        h = self.fc(self.norm(h)).reshape(2, -1, 4, 4).transpose(1, 2)  # (B, heads 4, T', 4)
        return F.scaled_dot_product_attention(h, h, h)


def test_every_kind_of_a_block_is_found_and_shares_sum_to_100():
    m = Block()
    opt = torch.optim.AdamW(m.parameters())

    def step():
        opt.zero_grad()
        m(torch.randn(2, 1, 64)).sum().backward()
        opt.step()

    shares = step_breakdown(step, steps=2)
    assert list(shares) == list(KINDS) and sum(shares.values()) == pytest.approx(100.0)
    for kind in ("convolution", "depthwise convolution", "normalization", "matmul/linear", "attention", "optimizer"):
        assert shares[kind] > 0, kind
    assert shares["LSTM"] == 0 and shares["CTC"] == 0
