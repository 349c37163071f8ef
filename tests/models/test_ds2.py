import pytest
import torch

from speechperf.config import load_preset
from speechperf.models import MODELS, build_model
from speechperf.models.ds2 import DS2Config
from speechperf.models.ds2 import TooShortError, output_lengths, parameter_count


def test_paper_preset_parameter_count_matches_formula_and_hand_count():
    cfg = load_preset("paper").model
    model = build_model(cfg)
    counted = sum(p.numel() for p in model.parameters())
    # Hand count for 93 -> conv 600 (k 11) -> 5 x LSTM 800 -> FC 30, BN after conv and each LSTM.
    conv = 93 * 600 * 11 + 600
    lstm1 = 4 * 800 * (600 + 800) + 8 * 800
    lstm_rest = 4 * (4 * 800 * (800 + 800) + 8 * 800)
    bn = 2 * 600 + 5 * 2 * 800
    fc = 800 * 30 + 30
    assert counted == parameter_count(cfg) == conv + lstm1 + lstm_rest + bn + fc == 25_639_630


def test_registry_has_ds2():
    assert "ds2" in MODELS


def test_output_shape_and_valid_conv_length():
    model = build_model(DS2Config(conv_channels=16, lstm_layers=2, lstm_hidden=8)).eval()
    x = torch.randn(3, 50, 93)
    lens = torch.tensor([50, 30, 11])
    lp, out_lens = model(x, lens)
    assert lp.shape == (20, 3, 30)  # (50 - 11) // 2 + 1 = 20
    assert out_lens.tolist() == [20, 10, 1]
    assert torch.allclose(lp.exp().sum(-1), torch.ones(20, 3), atol=1e-5)
    assert output_lengths(torch.tensor([11, 12, 13]), 11, 2).tolist() == [1, 1, 2]


def test_padding_does_not_change_valid_outputs():
    torch.manual_seed(0)
    model = build_model(DS2Config(conv_channels=16, lstm_layers=2, lstm_hidden=8, dropout=0.0))
    x = torch.randn(2, 40, 93)
    lens = torch.tensor([40, 25])
    model.train()
    lp_a, _ = model(x, lens)
    x2 = x.clone()
    x2[1, 25:] = 1e3  # garbage in the padding of utterance 1
    lp_b, _ = model(x2, lens)
    # Training-mode BN statistics use valid frames only, so nothing valid may change.
    assert torch.allclose(lp_a[:, 0], lp_b[:, 0], atol=1e-5)
    assert torch.allclose(lp_a[:8, 1], lp_b[:8, 1], atol=1e-5)


def test_too_short_input_is_rejected_with_message():
    model = build_model(DS2Config(conv_channels=8, lstm_layers=1, lstm_hidden=8))
    with pytest.raises(TooShortError, match="10 frames"):
        model(torch.randn(1, 10, 93), torch.tensor([10]))


def test_xavier_init_bounds():
    cfg = DS2Config(conv_channels=16, lstm_layers=1, lstm_hidden=8)
    model = build_model(cfg)
    w = model.fc.weight.detach()
    bound = (6.0 / (w.shape[0] + w.shape[1])) ** 0.5
    assert float(w.abs().max()) <= bound
    assert float(model.fc.bias.detach().abs().max()) == 0.0


def test_masked_batch_norm_equals_boolean_mask_reference_bit_for_bit():
    """The index form (no host sync on a GPU) computes exactly what x[mask] computes."""
    from speechperf.models.ds2 import MaskedBatchNorm, valid_index

    torch.manual_seed(0)
    bn, x, out_lens = MaskedBatchNorm(7), torch.randn(10, 3, 7, requires_grad=True), torch.tensor([10, 4, 7])
    mask = torch.arange(10)[:, None] < out_lens[None, :]
    ref = torch.zeros_like(x)
    ref[mask] = bn.bn(x[mask])
    ref_grad = torch.autograd.grad(ref.square().sum(), x)[0]
    got = bn(x, valid_index(out_lens, 10))
    assert torch.equal(got, ref) and torch.equal(torch.autograd.grad(got.square().sum(), x)[0], ref_grad)
    assert torch.equal(got[~mask], torch.zeros(int((~mask).sum()), 7))


def test_plan_gives_the_forward_lengths_and_index_on_the_cpu():
    model = build_model(load_preset("tiny").model).eval()
    x, lens = torch.randn(2, 40, 93), torch.tensor([40, 25])
    out_lens, planned = model.plan(lens, 40)
    assert out_lens.tolist() == [15, 8] and len(planned["index"]) == 23
    with torch.no_grad():
        a, la = model(x, lens)
        b, lb = model(x, lens, **planned)
    assert torch.equal(a, b) and torch.equal(la, out_lens) and torch.equal(lb, out_lens)
    with pytest.raises(TooShortError, match="an input has 5 frames"):
        model.plan(torch.tensor([40, 5]), 40)
