"""benchmarks/bench_lstm_ceiling.py: its FLOP count of an LSTM layer against torch's FLOP counter on
the same layer written as explicit GEMMs (torch's counter does not see oneDNN's fused LSTM), and a
run through the suite's runner."""
import importlib
import sys
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
runner = importlib.import_module("run")
ceiling = importlib.import_module("bench_lstm_ceiling")


def unrolled_lstm(x, w_ih, w_hh, b, h):
    """The LSTM's recursion with its GEMMs as torch.matmul: x (T, B, I) -> (T, B, H) from state h (B, H)."""
    t = x.shape[0]
    c = torch.zeros_like(h)
    gates_in = x @ w_ih.T  # (T, B, 4H): the input's GEMM batched over time, as torch's kernel does
    out = []
    for s in range(t):
        i, f, g, o = (gates_in[s] + h @ w_hh.T + b).chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        out.append(h)
    return torch.stack(out)


def test_the_flop_count_is_the_counter_s_on_the_explicit_gemms():
    t, batch, inputs, hidden = 7, 3, 5, 4
    x = torch.randn(t, batch, inputs, requires_grad=True)
    w_ih = torch.randn(4 * hidden, inputs, requires_grad=True)
    w_hh = torch.randn(4 * hidden, hidden, requires_grad=True)
    with FlopCounterMode(display=False) as fc:
        # h0 with a gradient: the formula counts the first step's recurrent GEMM backward too (a kernel that skips
        # it for a zero state does 1/T less)
        h0 = torch.zeros(batch, hidden, requires_grad=True)
        unrolled_lstm(x, w_ih, w_hh, torch.zeros(4 * hidden), h0).sum().backward()
    assert fc.get_total_flops() == ceiling.lstm_flops(t, batch, inputs, hidden)


def test_a_run_prints_the_lstm_s_share_of_the_gemm_rate(capsys):
    assert runner.main(["lstm_ceiling", "--no-ledger", "--rounds", "1", "--gemm", "64", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "the LSTM's share of its precision's best GEMM rate: fp32 " in out
    if torch.backends.mkldnn.is_available():  # MKL's float32 product and oneDNN's, the faster the reference
        assert "  gemm fp32: " in out and "  gemm fp32 oneDNN: " in out
    assert "lstm_ceiling: the LSTM layer's fp32 FLOP rate (forward + backward) / the fp32 GEMM's = " in out
