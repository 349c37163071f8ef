"""MFU's FLOP counts against hand arithmetic, the exact quadratic fit, the LSTM formula
against the DS2 model's analytic count, and the summary of rows with and without FLOPs."""
import json
import sqlite3

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from speechperf.config import load_preset
from speechperf.hardware.mfu import (FlopModel, RunFlops, achieved, count_step_flops, counter, exact_quadratic,
                                    fit_flop_model, fit_lengths, mfu_columns)
from speechperf.models import build_model
from speechperf.models.ds2 import flops_per_frame
from speechperf.results import ResultsDB

aten = torch.ops.aten


class ConvLinear(nn.Module):
    """Strided conv then a linear CTC head: the shapes a training step gives it."""

    def __init__(self, feats=6, channels=8, kernel=3, stride=2, classes=5):
        super().__init__()
        self.conv = nn.Conv1d(feats, channels, kernel, stride=stride)
        self.fc = nn.Linear(channels, classes)

    def plan(self, lengths, frames):
        return (lengths - 3) // 2 + 1, {}

    def forward(self, x, lengths):
        h = self.conv(x.transpose(1, 2)).permute(2, 0, 1)  # (B, T, F) -> (B, C, T') -> (T', B, C)
        return self.fc(h).log_softmax(-1), (lengths - 3) // 2 + 1


class Attention(nn.Module):
    """Input projection, multi-head self-attention (scaled_dot_product_attention), linear head."""

    def __init__(self, feats=6, d=8, heads=2, classes=5):
        super().__init__()
        self.heads = heads
        self.inp = nn.Linear(feats, d)
        self.out = nn.Linear(d, classes)

    def plan(self, lengths, frames):
        return lengths, {}

    def forward(self, x, lengths):
        b, t, _ = x.shape
        h = self.inp(x).reshape(b, t, self.heads, -1).transpose(1, 2)  # (B, T, d) -> (B, heads, T, d/heads)
        a = F.scaled_dot_product_attention(h, h, h).transpose(1, 2).reshape(b, t, -1)  # -> (B, T, d)
        return self.out(a).transpose(0, 1).log_softmax(-1), lengths  # (T, B, C)


def test_conv_and_linear_counts_are_hand_arithmetic():
    m = ConvLinear()
    for lengths in ([9], [9, 20, 31]):
        frames = max(lengths)
        out = (frames - 3) // 2 + 1  # the batch is padded: every utterance computes the longest's frames
        conv = 2 * 8 * 6 * 3 * out * len(lengths)
        fc = 2 * 8 * 5 * out * len(lengths)
        # backward: the conv's weight gradient only (the features need none), the head's input and weight
        assert count_step_flops(m, lengths, 6) == 2 * conv + 3 * fc


def test_attention_fit_is_exact_quadratic():
    m = Attention()
    with counter() as fc:
        m(torch.randn(1, 20, 6), torch.tensor([20]))[0].sum().backward()
    assert {str(k) for k in fc.get_flop_counts()["Global"]} & {"aten._scaled_dot_product_flash_attention_for_cpu",
                                                               "aten.bmm"}  # attention was counted
    fm = fit_flop_model(m, "attention", 6, min_frames=1)
    d, feats, classes = 8, 6, 5
    # per frame: the input projection (forward + weight gradient) and the head (x3); per frame squared:
    # QK^T and AV (2 x 2 L^2 d forward) and their backward (twice that)
    assert (fm.a, fm.b, fm.c) == (0.0, 4 * feats * d + 6 * d * classes, 12 * d)
    for n in (37, 101, 250):  # lengths the fit never saw: no stride, so exact everywhere
        assert count_step_flops(m, [n], 6) == fm.utterance(n)


def test_exact_quadratic_recovers_rational_coefficients():
    f = lambda n: 7 + n * 3 // 2 + 5 * n * n  # noqa: E731 (n even: exact halves)
    a, b, c = exact_quadratic({n: f(n) for n in (32, 96, 160)})
    assert (a, b, c) == (7, 1.5, 5)


def _lstm_formula(inp, hidden, steps):
    """DS2's count of one LSTM layer: 4 gates x (input + recurrent) multiply-adds per step, x3 for
    forward and backward."""
    return 3 * 2 * 4 * hidden * (inp + hidden) * steps


def _rnn_path(model, x) -> set[str]:
    with counter() as fc:
        model(x)[0].sum().backward()
    return {str(k) for k in fc.get_flop_counts()["Global"]}


@pytest.mark.filterwarnings("ignore:TF32 acceleration")  # torch's note when the oneDNN flags are switched
def test_lstm_count_matches_the_analytic_formula():
    lstm = nn.LSTM(12, 16, num_layers=2)
    x = torch.randn(10, 3, 12, requires_grad=True)  # (T, B, I): a layer above the first, whose input needs a gradient
    with counter() as fc:
        lstm(x)[0].sum().backward()
    expected = _lstm_formula(12, 16, 30) + _lstm_formula(16, 16, 30)
    if "aten.mkldnn_rnn_layer" in _rnn_path(lstm, x):  # oneDNN: counted by our formula
        assert fc.get_total_flops() == expected
    # torch's own cell-by-cell path (counted by torch's matmul formulas) skips the gradient of the
    # zero initial state: one step's recurrent multiply-adds per layer and sequence
    with torch.backends.mkldnn.flags(enabled=False):
        with counter() as native:
            lstm(x)[0].sum().backward()
    assert native.get_total_flops() == expected - 2 * (2 * 4 * 16 * 16 * 3)


def test_ds2_count_is_three_times_its_forward_formula():
    cfg = load_preset("tiny").model
    model = build_model(cfg)
    k, s, h = cfg.conv_kernel, cfg.conv_stride, cfg.lstm_hidden
    onednn = "aten.mkldnn_rnn_layer" in _rnn_path(model.lstms[0], torch.randn(4, 1, cfg.conv_channels))
    for frames in (64, 301):
        out = (frames - k) // s + 1
        # flops_per_frame is forward FLOPs per input frame (conv over T, the rest over T/stride); the
        # step is 3x that, less the conv's input gradient, which the features do not need
        per_out = 3 * flops_per_frame(cfg) * s - 2 * cfg.input_dim * cfg.conv_channels * k
        h0 = 0 if onednn else cfg.lstm_layers * 2 * 4 * h * h  # torch's own path: no zero-state gradient
        assert count_step_flops(model, [frames], cfg.input_dim) == pytest.approx(per_out * out - h0, rel=1e-12)


def test_batch_flops_from_cpu_lengths():
    cfg = load_preset("tiny").model
    model = build_model(cfg)
    fm = fit_flop_model(model, "ds2", cfg.input_dim, cfg.conv_kernel)
    assert fm.fit_lengths == tuple(fit_lengths(cfg.conv_kernel)) and fm.c == 0.0  # no attention: linear
    on_class = [48, 112, 400]  # multiples of 16: exactly the fitted polynomial
    assert fm.batch(torch.tensor(on_class)) == sum(count_step_flops(model, [n], cfg.input_dim) for n in on_class)
    one_frame = 3 * flops_per_frame(cfg) * cfg.conv_stride  # an output frame's training FLOPs
    for n in (49, 77, 303):  # the strided conv rounds: off by under one output frame
        assert abs(fm.utterance(n) - count_step_flops(model, [n], cfg.input_dim)) < one_frame


def test_summary_of_rows_and_rows_of_an_older_release(tmp_path):
    rf = RunFlops(FlopModel("ds2", 0.0, 10.0, 0.0, (32, 96, 160)), 1.0, "test peak", 0.0)
    rows = [{"model_flops": 4e11, "step_s": 1.0}, {"model_flops": 2e11, "step_s": 1.0}, {"step_s": 5.0}]
    s = rf.summary(rows)
    assert s["model_flops_per_step"] == 3e11 and s["model_flops_steps"] == 2
    assert s["tflops"] == pytest.approx(0.3) and s["mfu_pct"] == pytest.approx(30.0) and s["peak_source"] == "test peak"
    assert achieved(1e12, 1.0, None) == {"tflops": 1.0, "mfu_pct": None, "mfu_note": None}  # no peak: no MFU, never a made-up one
    # a database written before the column existed reads, and gets the column when opened for writing
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE iterations (run_id TEXT, iteration INTEGER, epoch INTEGER, clock_s REAL, loss REAL, "
                  "batch_size INTEGER, frames INTEGER, audio_s REAL, step_s REAL, utts_per_s REAL, audio_s_per_s REAL, "
                  "PRIMARY KEY (run_id, iteration))")
        c.execute("INSERT INTO iterations VALUES ('r', 1, 1, 1.0, 2.0, 4, 400, 4.0, 0.5, 8.0, 8.0)")
    with ResultsDB(path, readonly=True) as db:
        old = db.query("SELECT * FROM iterations")
    assert "model_flops" not in old[0] and rf.summary(old)["tflops"] is None
    with ResultsDB(path) as db:
        assert db.query("SELECT model_flops FROM iterations") == [{"model_flops": None}]


def test_conformer_fit_is_quadratic_and_exact_at_another_length():
    from speechperf.models import model_config

    cfg = model_config({"name": "conformer", "d_model": 32, "layers": 2, "heads": 4, "conv_kernel": 5,
                        "subsampling_channels": 16})
    model = build_model(cfg)
    fm = fit_flop_model(model, "conformer", 93, model.min_frames)
    assert fm.c > 0  # self-attention over the subsampled frames
    n = fm.fit_lengths[-1] + 10 * 16  # a length of the fitted class the fit never saw
    assert count_step_flops(model, [n], 93) == pytest.approx(fm.utterance(n), rel=1e-12)


def test_steps_above_their_peak_get_no_mfu_and_drop_a_cpu_peak(tmp_path, monkeypatch):
    """A demo on a 2-core EPYC read MFU 204%: its CPU peak was cached from a busy machine.
    Above 100% the MFU is refused, said so, and the cached peak is dropped for the next run."""
    from speechperf.hardware import measured_peak as mp

    over = achieved(2e12, 1.0, 1.0)
    assert over["mfu_pct"] is None and over["mfu_note"] == (
        "no MFU: the steps achieved 2 TFLOPS, above the peak of 1 they are measured against (200%): that peak is wrong")
    assert achieved(1e12, 1.0, 1.0) == {"tflops": 1.0, "mfu_pct": 100.0, "mfu_note": None}
    monkeypatch.setenv("SPEECHPERF_CACHE", str(tmp_path))
    (tmp_path / mp.CACHE_FILE).write_text(json.dumps({mp.cache_key(1, "fp32"): {"tflops": 0.1}}))
    rf = RunFlops(FlopModel("ds2", 0.0, 10.0, 0.0, (32, 96, 160)), 0.1, "measured", 0.0, cpu_peak=(1, "fp32"))
    s = rf.summary([{"model_flops": 4e11, "step_s": 1.0}])
    assert s["mfu_pct"] is None and s["mfu_note"].endswith("(measured low; its cached entry is dropped: the next "
                                                           "run measures it again)")
    assert json.loads((tmp_path / mp.CACHE_FILE).read_text()) == {}
    gpu = RunFlops(FlopModel("ds2", 0.0, 10.0, 0.0, (32, 96, 160)), 0.1, "a sheet", 0.0)
    assert gpu.summary([{"model_flops": 4e11, "step_s": 1.0}])["mfu_note"].endswith("that peak is wrong")
    # a summary written before the check reads the same
    cols = mfu_columns({"tflops": 0.0415, "mfu_pct": 204.2, "peak_tflops": 0.0203, "peak_source": "measured"})
    assert cols["MFU %"] is None and cols["MFU note"].startswith("no MFU: the steps achieved 0.0415 TFLOPS")
    assert mfu_columns({"tflops": 0.01, "mfu_pct": 50.0})["MFU note"] is None
