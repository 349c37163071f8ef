"""The transducer model (speechperf/models/rnnt.py): shapes and lengths of both encoders
and both prediction networks, padding, its parameter count and FLOPs by formula against the
built model and torch's counter, and a forward that reads no device values on the host."""
import re

import pytest
import torch
import torch.nn as nn

from speechperf.models import MODELS, build_model, describe, model_config
from speechperf.models.contract import TooShortError, planned_forward
from speechperf.models.rnnt import (LSTMEncoder, Transducer, TransducerConfig, flops, parameter_count,
                                          stack_frames)
from speechperf.hardware.mfu import counter

CONFORMER = {"encoder": "conformer", "d_model": 16, "layers": 2, "heads": 2, "conv_kernel": 5,
             "subsampling_channels": 4}
LSTM = {"encoder": "lstm", "enc_hidden": 12, "enc_pre_layers": 2, "enc_post_layers": 2}
PREDICTORS = {"lstm": {"pred": "lstm", "pred_layers": 2}, "stateless": {"pred": "stateless", "context_size": 3}}
SIZES = {"pred_dim": 8, "joint_dim": 10, "num_classes": 7, "dropout": 0.0, "attention_dropout": 0.0,
         "pred_dropout": 0.0}
KINDS = [(e, p) for e in ("conformer", "lstm") for p in PREDICTORS]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: a second thread only waits for the first (on a busy 2-core machine a test
    here took 15x longer with two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def cfg_of(encoder: str, pred: str, **kw) -> TransducerConfig:
    return model_config({"name": "transducer", **(CONFORMER if encoder == "conformer" else LSTM),
                         **PREDICTORS[pred], **SIZES, **kw})


def small(encoder: str, pred: str, **kw) -> Transducer:
    torch.manual_seed(0)
    return build_model(cfg_of(encoder, pred, **kw)).eval()


def test_registered_with_its_config():
    assert MODELS.lookup("transducer").config is TransducerConfig
    assert isinstance(build_model(TransducerConfig()), Transducer) and TransducerConfig().problems() == []


@pytest.mark.parametrize("encoder, pred", KINDS)
def test_shapes_and_lengths(encoder, pred):
    model = small(encoder, pred)
    lens = torch.tensor([50, 31, 7, 1])
    enc, out_lens = model(torch.randn(4, 50, 93), lens)
    want = [13, 8, 2, 1] if encoder == "conformer" else [9, 6, 2, 1]  # 4x; ceil(ceil(L / 3) / 2)
    assert out_lens.tolist() == want and torch.equal(model.output_lengths(lens), out_lens)
    assert enc.shape == (4, max(want), 10)  # (B, T', joint_dim): no log-probs
    plan_lens, planned = model.plan(lens, 50)
    assert torch.equal(plan_lens, out_lens) and planned == {}
    g, state = model.predict(torch.randint(1, 7, (4, 5)))
    assert g.shape == (4, 6, 10)  # (B, U+1, J)
    assert all(s.shape[0] == 4 for s in state)  # batch-first states
    logits = model.joint(enc[:, :, None], g[:, None])
    assert logits.shape == (4, max(want), 6, 7)  # (B, T', U+1, V)
    step, _ = model.predict_step(torch.zeros(4, dtype=torch.long), None)
    assert step.shape == (4, 10)


def test_the_lstm_encoder_stacks_as_mlperf_rnnt():
    """Frame stacking x3 (each 3 consecutive frames side by side), then x2 after the first LSTMs."""
    x = torch.arange(2 * 7 * 2, dtype=torch.float32).reshape(2, 7, 2)
    y, lens = stack_frames(x, torch.tensor([7, 4]), 3)
    assert y.shape == (2, 3, 6) and lens.tolist() == [3, 2]
    assert y[0, 0].tolist() == x[0, :3].flatten().tolist() and y[0, 2].tolist() == x[0, 6].tolist() + [0.0] * 4
    assert y[1, 1].tolist() == x[1, 3].tolist() + [0.0] * 4  # past its 4 frames: zeros, not the padding's values
    enc = LSTMEncoder(cfg_of("lstm", "lstm", frame_stack=3, time_stack=2))
    assert [lstm.input_size for lstm in enc.pre] == [240, 12] and [lstm.input_size for lstm in enc.post] == [24, 12]
    assert enc.output_lengths(torch.tensor([600, 6, 7, 1])).tolist() == [100, 1, 2, 1]


@pytest.mark.parametrize("encoder, pred", KINDS)
def test_padding_changes_no_valid_output(encoder, pred):
    """Garbage in the padding of the features and of the labels: each utterance's valid encoder
    frames and label positions equal those of the utterance alone."""
    model = small(encoder, pred)
    lens, ulens = torch.tensor([41, 64, 23]), torch.tensor([3, 6, 1])
    x = torch.full((3, 70, 93), 1e3)
    y = torch.full((3, 6), 5)
    for b, (n, u) in enumerate(zip(lens.tolist(), ulens.tolist())):
        x[b, :n] = torch.randn(n, 93)
        y[b, :u] = torch.randint(1, 7, (u,))
    with torch.no_grad():
        enc, out = model(x, lens)
        g, _ = model.predict(y)
        for b, (n, u) in enumerate(zip(lens.tolist(), ulens.tolist())):
            alone, alone_out = model(x[b: b + 1, :n], lens[b: b + 1])
            assert alone.shape[1] == alone_out[0] == out[b]
            torch.testing.assert_close(enc[b, : out[b]], alone[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(g[b, : u + 1], model.predict(y[b: b + 1, :u])[0][0], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("pred", PREDICTORS)
def test_predict_step_repeats_predict(pred):
    """Step by step from the start (the blank first) is the whole sequence at once."""
    model = small("lstm", pred)
    y = torch.randint(1, 7, (3, 5))
    with torch.no_grad():
        whole, _ = model.predict(y)
        g, state = model.predict_step(torch.zeros(3, dtype=torch.long), None)
        steps = [g]
        for u in range(5):
            g, state = model.predict_step(y[:, u], state)
            steps.append(g)
    torch.testing.assert_close(torch.stack(steps, 1), whole, atol=1e-6, rtol=1e-6)


def test_stateless_state_is_the_last_context_tokens():
    model = small("lstm", "stateless")
    _, (context,) = model.predict_step(torch.tensor([4, 2]), None)
    assert context.tolist() == [[0, 0, 4], [0, 0, 2]]
    _, (context,) = model.predict_step(torch.tensor([3, 1]), (context,))
    assert context.tolist() == [[0, 4, 3], [0, 2, 1]]


def test_joint_is_a_linear_map_of_tanh_of_the_sum():
    model = small("lstm", "lstm")
    e, g = torch.randn(2, 3, 1, 10), torch.randn(2, 1, 4, 10)
    want = torch.tanh(e + g) @ model.out.weight.T + model.out.bias
    torch.testing.assert_close(model.joint(e, g), want)


@pytest.mark.parametrize("encoder, pred", KINDS)
def test_gradients_reach_every_parameter(encoder, pred):
    model = small(encoder, pred, dropout=0.1, pred_dropout=0.1, joint_dropout=0.1).train()
    enc, _ = model(torch.randn(2, 40, 93), torch.tensor([40, 29]))
    g, _ = model.predict(torch.randint(1, 7, (2, 4)))
    model.joint(enc[:, :, None], g[:, None]).log_softmax(-1)[..., 1:].sum().backward()
    for name, p in model.named_parameters():
        if name.endswith("embed.weight"):  # the blank's row is padding_idx: no gradient
            assert p.grad[0].abs().sum() == 0 and p.grad[1:].abs().sum() > 0, name
            continue
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("encoder, pred", KINDS)
@pytest.mark.parametrize("subsampling, ctc_weight", [(4, 0.0), (8, 0.0), (8, 0.3)])
def test_parameter_count_by_formula(encoder, pred, subsampling, ctc_weight):
    cfg = cfg_of(encoder, pred, subsampling=subsampling, context_size=3 if subsampling == 4 else 1, frame_stack=2,
                 ctc_weight=ctc_weight)
    assert parameter_count(cfg) == sum(p.numel() for p in build_model(cfg).parameters()) == describe(cfg)["params"]


def test_default_and_mlperf_sizes():
    """The defaults: NeMo's Conformer-Transducer small (the CTC Conformer's encoder, 1 x 320 LSTM
    prediction network, joint 320); MLPerf RNN-T's sizes with 1023 BPE units + the blank."""
    assert parameter_count(TransducerConfig()) == describe(TransducerConfig())["params"] == 13_471_710
    mlperf = TransducerConfig(encoder="lstm", pred_dim=512, pred_layers=2, joint_dim=512, num_classes=1024,
                              enc_hidden=1024, enc_pre_layers=2, enc_post_layers=3)
    assert parameter_count(mlperf) == describe(mlperf)["params"]
    assert 48e6 < parameter_count(mlperf) < 50e6  # MLPerf's reference RNN-T: ~49 M


@pytest.mark.parametrize("encoder, pred", KINDS)
def test_flops_match_torchs_counter(encoder, pred):
    """The formula against FlopCounterMode (with mfu's formulas for the CPU LSTM and attention)
    on a forward of the encoder, the prediction network and the joint, at lengths that do and
    do not divide the strides."""
    model = small(encoder, pred)
    for frames, labels in ((64, 5), (77, 9)):
        with torch.no_grad(), counter() as fc:
            enc, _ = model(torch.randn(1, frames, 93), torch.tensor([frames]))
            g, _ = model.predict(torch.randint(1, 7, (1, labels)))
            model.joint(enc[:, :, None], g[:, None])
        assert fc.get_total_flops() == flops(model.cfg, frames, labels) > 0, (frames, labels)


def test_flops_count_the_auxiliary_ctc_head():
    """With ``ctc_weight`` > 0 the step also runs the CTC head over the encoder's frames: counted by
    torch's counter on that head alone, added to the formula; without it, no head and no term."""
    model = small("conformer", "lstm", ctc_weight=0.3)
    for frames in (64, 77):
        enc, _ = model(torch.randn(1, frames, 93), torch.tensor([frames]))
        with torch.no_grad(), counter() as fc:
            model.ctc_log_probs(enc)
        assert fc.get_total_flops() == flops(model.cfg, frames, 5) - flops(cfg_of("conformer", "lstm"), frames, 5) > 0
    assert small("conformer", "lstm").ctc_head is None


def test_flops_grow_with_the_joints_lattice():
    cfg = cfg_of("lstm", "lstm")
    t = 600 // 6
    assert flops(cfg, 600, 50) - flops(cfg, 600, 49) == pytest.approx(t * 2 * 10 * 7 + 2 * 4 * 8 * 16 * 2 + 2 * 8 * 10)


@pytest.mark.parametrize("encoder, pred", KINDS)
def test_forward_reads_no_values_on_the_host(encoder, pred):
    """On the meta device tensors have shapes but no values: any .item(), bool() or
    value-sized indexing in forward, predict or joint would fail here."""
    with torch.device("meta"):
        model = build_model(cfg_of(encoder, pred))
        enc, out = model(torch.empty(3, 50, 93), torch.empty(3, dtype=torch.long))
        g, _ = model.predict(torch.empty(3, 4, dtype=torch.long))
        step, _ = model.predict_step(torch.empty(3, dtype=torch.long), None)
        logits = model.joint(enc[:, :, None], g[:, None])
    assert enc.shape == (3, 13 if encoder == "conformer" else 9, 10) and out.shape == (3,)
    assert logits.shape == (3, enc.shape[1], 5, 7) and step.shape == (3, 10)


def test_planned_forward_and_too_short_inputs():
    model = small("conformer", "lstm")
    enc, out_lens = planned_forward(model, torch.randn(2, 30, 93), torch.tensor([30, 9]))
    assert enc.shape == (2, 8, 10) and out_lens.tolist() == [8, 3]
    with pytest.raises(TooShortError, match="transducer"):
        model.plan(torch.tensor([5, 0]), 5)
    with pytest.raises(TooShortError, match="0 frames"):
        model(torch.zeros(2, 5, 93), torch.tensor([5, 0]))


def test_reads_the_log_mel_columns_only():
    for encoder in ("conformer", "lstm"):
        model = small(encoder, "lstm")
        x = torch.randn(2, 40, 93)
        y = x.clone()
        y[..., 80:] = torch.randn(2, 40, 13)
        lens = torch.tensor([40, 33])
        assert torch.equal(model(x, lens)[0], model(y, lens)[0])


def test_bf16_autocast_on_cpu():
    model = small("conformer", "stateless")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        enc, _ = model(torch.randn(2, 40, 93), torch.tensor([40, 20]))
        g, _ = model.predict(torch.randint(1, 7, (2, 3)))
        logits = model.joint(enc[:, :, None], g[:, None])
    assert logits.shape == (2, 10, 4, 7) and torch.isfinite(logits.float()).all()


@pytest.mark.parametrize("field, value, match", [
    ("encoder", "gru", r"model\.encoder='gru' must be one of conformer, lstm"),
    ("pred", "rnn", r"model\.pred='rnn' must be one of lstm, stateless"),
    ("num_classes", 1, r"model\.num_classes=1 must be >= 2"),
    ("joint_dim", 0, r"model\.joint_dim=0 must be >= 1"),
    ("context_size", 0, r"model\.context_size=0 must be >= 1"),
    ("pred_dropout", 1.0, r"model\.pred_dropout=1\.0 not in \[0, 1\)"),
    ("joint_dropout", -0.5, r"model\.joint_dropout=-0\.5 not in \[0, 1\)"),
    ("ctc_weight", 1.0, r"model\.ctc_weight=1\.0 not in \[0, 1\)"),
    ("heads", 3, r"model\.d_model=176 must be an even multiple of model\.heads=3"),
    ("subsampling", 6, r"model\.subsampling=6 must be one of 2, 4, 8"),
])
def test_problems_name_the_field_and_value(field, value, match):
    problems = TransducerConfig(**{field: value}).problems()
    assert len(problems) == 1 and re.search(match, problems[0]), problems


@pytest.mark.parametrize("field, value, match", [
    ("enc_hidden", 0, r"model\.enc_hidden=0 must be >= 1"),
    ("time_stack", 0, r"model\.time_stack=0 must be >= 1"),
    ("input_dim", 94, r"model\.input_dim=94 must be in 1\.\.93"),
    ("dropout", 1.0, r"model\.dropout=1\.0 not in \[0, 1\)"),
])
def test_lstm_encoder_problems(field, value, match):
    problems = TransducerConfig(encoder="lstm", **{field: value}).problems()
    assert len(problems) == 1 and re.search(match, problems[0]), problems
    assert TransducerConfig(encoder="lstm", heads=3).problems() == []  # the Conformer's fields are not read


def test_one_lstm_per_encoder_layer():
    """Separate single-layer LSTMs, so speechperf's cheap CPU dropout runs between them."""
    model = small("lstm", "lstm")
    assert all(isinstance(m, nn.LSTM) and m.num_layers == 1 for m in (*model.encoder.pre, *model.encoder.post))
