"""Training FLOPs that hold: a grouped convolution's backward counted with its groups, and
every registered model's count against an analytic count written from its architecture.

Convention of the analytic counts: a matrix product or convolution of m x n x k
multiply-adds is 2 m n k FLOPs forward; its backward is the input gradient and the weight
gradient, each as many FLOPs as the forward (x3 in all), except for a layer whose input is
the features (no gradient wanted: x2). Attention: QK^T and AV, 2 L^2 d each forward, x3.
An LSTM step: 4 gates x (input + recurrent) multiply-adds, x3; an LSTMP adds its projection.
Element-wise work, normalization, pooling, the loss and biases are not counted (mfu.py's
contract)."""
import importlib.util

import pytest
import torch
import torch.nn as nn

from speechperf.hardware.mfu import count_step_flops, counter
from speechperf.models import MODELS, build_model, encdec, fastconformer, model_config, rnnt

RNNT_LOSS = importlib.util.find_spec("speechperf.objectives.rnnt_loss") is not None  # the transducer's loss

FEATS = 93  # prepared feature columns; each model reads its first input_dim


def _train_flops(module: nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """(forward, forward + backward) FLOPs of ``module`` on ``x`` under mfu's counter."""
    with counter() as fwd:
        module(x)
    with counter() as step:
        module(x).sum().backward()
    return fwd.get_total_flops(), step.get_total_flops()


@pytest.mark.parametrize("cls", [nn.Conv1d, nn.ConvTranspose1d])
def test_depthwise_convolution_backward_is_twice_its_forward(cls):
    """A Conformer's depthwise convolution: each channel sees only itself, so its input and
    weight gradients cost a forward each (torch 2.13's own formula gives 178x the forward
    here, counting the weight gradient as if every channel fed every other)."""
    conv = cls(176, 176, 31, groups=176, padding=15)
    forward, step = _train_flops(conv, torch.randn(2, 176, 100, requires_grad=True))
    assert forward == 2 * 2 * 176 * 31 * 100  # batch x channels x kernel x frames multiply-adds
    assert step == 3 * forward


@pytest.mark.parametrize("groups", [1, 4])
def test_grouped_and_dense_convolutions(groups):
    conv = nn.Conv2d(8, 16, 3, padding=1, groups=groups)
    forward, step = _train_flops(conv, torch.randn(1, 8, 10, 12, requires_grad=True))
    assert forward == 2 * 16 * (8 // groups) * 9 * 10 * 12
    assert step == 3 * forward
    _, weight_only = _train_flops(conv, torch.randn(1, 8, 10, 12))  # features: no input gradient
    assert weight_only == 2 * forward


def _ds2(cfg, frames: int) -> float:
    out = (frames - cfg.conv_kernel) // cfg.conv_stride + 1
    flops = 2 * 2 * cfg.input_dim * cfg.conv_channels * cfg.conv_kernel * out  # conv on the features: x2
    inp = cfg.conv_channels
    for _ in range(cfg.lstm_layers):
        flops += 3 * 2 * 4 * cfg.lstm_hidden * (inp + cfg.lstm_hidden) * out
        inp = cfg.lstm_hidden
    return flops + 3 * 2 * cfg.lstm_hidden * cfg.num_classes * out


def _dnn(cfg, frames: int) -> float:
    dims = [cfg.frame_dim] + [cfg.hidden] * cfg.layers + [cfg.num_classes]
    layers = [2 * a * b * frames for a, b in zip(dims, dims[1:])]
    return 2 * layers[0] + 3 * sum(layers[1:])  # the first reads the features: no input gradient


def _cldnn(cfg, frames: int) -> float:
    bands = cfg.input_dim - cfg.conv_freq + 1  # valid in frequency, 'same' in time
    flops = 2 * 2 * 3 * cfg.conv_maps * cfg.conv_time * cfg.conv_freq * frames * bands  # on the features: x2
    inp = cfg.conv_out
    for _ in range(cfg.lstm_layers):
        gates = 2 * 4 * cfg.lstm_cells * (inp + cfg.lstm_proj)
        flops += 3 * (gates + 2 * cfg.lstm_cells * cfg.lstm_proj) * frames  # + the projection
        inp = cfg.lstm_proj
    dims = [cfg.lstm_proj] + [cfg.dnn_hidden] * cfg.dnn_layers + [cfg.num_classes]
    return flops + 3 * sum(2 * a * b * frames for a, b in zip(dims, dims[1:]))


def _conformer(cfg, frames: int) -> float:
    t, f, c_in, c = frames, cfg.input_dim, 1, cfg.subsampling_channels
    flops = 0
    for stage in range(cfg.subsampling.bit_length() - 1):  # 3x3 stride-2 Conv2d stages
        t, f = (t - 1) // 2 + 1, (f - 1) // 2 + 1
        flops += (2 if stage == 0 else 3) * 2 * c_in * c * 9 * t * f  # the first reads the features
        c_in = c
    d, k = cfg.d_model, cfg.conv_kernel
    flops += 3 * 2 * c * f * d * t  # subsampling's linear map to d_model
    per_block = (2 * 2 * (2 * t * d * cfg.ff_mult * d)  # two feed-forwards, two linears each
                 + 2 * t * d * 3 * d + 2 * t * d * d  # QKV and output projections
                 + 2 * 2 * t * t * d  # QK^T and AV over all heads
                 + 2 * t * d * 2 * d + 2 * t * d * k + 2 * t * d * d)  # pointwise, depthwise, pointwise
    return flops + 3 * cfg.layers * per_block + 3 * 2 * t * d * cfg.num_classes


def _transducer(cfg, frames: int) -> float:
    """Its forward by formula (models/rnnt.py: encoder, prediction network over U+1 labels,
    joint over T' x (U+1)) x3, less the weight-only first convolution's input gradient; the
    labels as the objective's probe draws them (a quarter of the output frames)."""
    out = int(build_model(cfg).output_lengths(torch.tensor([frames]))[0])
    t, f = (frames - 1) // 2 + 1, (cfg.input_dim - 1) // 2 + 1
    return 3 * rnnt.flops(cfg, frames, max(out // 4, 1)) - 2 * cfg.subsampling_channels * 9 * t * f


def _aed(cfg, frames: int) -> float:
    """Its forward by formula (models/encdec.py: encoder, decoder over U+1 positions, its cross-attention
    over T' x (U+1)) x3, less the weight-only first convolution's input gradient; the labels as the
    objective's probe draws them (a quarter of the output frames)."""
    out = int(build_model(cfg).output_lengths(torch.tensor([frames]))[0])
    t, f = (frames - 1) // 2 + 1, (cfg.input_dim - 1) // 2 + 1
    return 3 * encdec.flops(cfg, frames, max(out // 4, 1)) - 2 * cfg.subsampling_channels * 9 * t * f


# Small configurations of every registered model and their analytic counts.
ANALYTIC = {
    "ds2": ({"name": "ds2", "conv_channels": 32, "conv_kernel": 11, "conv_stride": 2, "lstm_layers": 2,
             "lstm_hidden": 48}, _ds2),
    "dnn": ({"name": "dnn", "hidden": 64, "layers": 3}, _dnn),
    "cldnn": ({"name": "cldnn", "conv_maps": 8, "lstm_cells": 64, "lstm_proj": 32, "dnn_hidden": 64}, _cldnn),
    "conformer": ({"name": "conformer", "d_model": 64, "layers": 2, "heads": 4, "conv_kernel": 15,
                   "subsampling_channels": 16, "attention_dropout": 0.0}, _conformer),
    # its own formula (models/fastconformer.py), written from NeMo's layout and checked against the counter here
    "fastconformer": ({"name": "fastconformer", "d_model": 32, "layers": 2, "heads": 4, "subsampling_channels": 16,
                       "attention_dropout": 0.0}, lambda cfg, frames: fastconformer.training_flops(cfg, frames)),
    "transducer": ({"name": "transducer", "d_model": 32, "layers": 2, "heads": 4, "conv_kernel": 15,
                    "subsampling_channels": 16, "attention_dropout": 0.0, "pred_dim": 24, "joint_dim": 20}, _transducer),
    "aed": ({"name": "aed", "d_model": 32, "layers": 2, "heads": 4, "subsampling_channels": 16,
             "attention_dropout": 0.0, "dec_layers": 2, "dec_heads": 4, "dec_dropout": 0.0}, _aed),
}


def test_every_registered_model_has_an_analytic_count():
    assert MODELS.names() == sorted(ANALYTIC)  # a new model needs its count here


@pytest.mark.filterwarnings("ignore:TF32 acceleration")  # torch's note when the oneDNN flags are switched
@pytest.mark.parametrize("name", sorted(ANALYTIC))
def test_training_flops_match_the_analytic_count(name):
    if name == "transducer" and not RNNT_LOSS:
        pytest.skip("the transducer's objective needs the RNN-T loss (speechperf/objectives/rnnt_loss.py)")
    values, analytic = ANALYTIC[name]
    cfg = model_config(values)
    model = build_model(cfg)
    for frames in (160, 211):
        counted = count_step_flops(model, [frames], FEATS)
        # within 2%: torch's cell-by-cell LSTMP path skips the zero initial state's gradient (one step)
        assert counted == pytest.approx(analytic(cfg, frames), rel=0.02), (name, frames)
