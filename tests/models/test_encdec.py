"""The attention encoder-decoder (models/encdec.py): the FastConformer encoder and a Transformer
decoder; parameters and FLOPs by formula against the built model and torch's counter, the
FLOP model's U^2 term, padding and causality, and ``canary-aed-sizes`` against Canary-1B's count."""
import dataclasses
import re

import pytest
import torch

from speechperf.config import load_preset
from speechperf.models import MODELS, build_model, describe
from speechperf.models.encdec import AED, AEDConfig, flops, parameter_count, sinusoids
from speechperf.models.fastconformer import FastConformerEncoder
from speechperf.hardware.mfu import MODULUS, count_step_flops, counter, fit_flop_model

TINY = AEDConfig(d_model=32, layers=2, heads=2, subsampling_channels=8, dec_layers=2, dec_heads=2, num_classes=11,
                 dropout=0.0, attention_dropout=0.0, dec_dropout=0.0)
# Published (read 2026-12): nvidia/canary-1b's model card: "24 encoder layers and 24 layers of decoder
# layers", a FastConformer encoder and a Transformer decoder, 1 B parameters; its tokenizer four languages'
# SentencePiece models concatenated (4 x 1,024 pieces) and its special tokens (4,128 taken here)
PUBLISHED, CANARY_TOKENS = 1e9, 4128


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny(**kw) -> AED:
    torch.manual_seed(0)
    return build_model(dataclasses.replace(TINY, **kw)).eval()


def test_registered_with_its_config_and_the_fastconformers_encoder():
    assert MODELS.lookup("aed").config is AEDConfig
    model = tiny()
    assert type(model.encoder) is FastConformerEncoder
    enc, out_lens = model(torch.randn(2, 90, 93), torch.tensor([90, 41]))
    assert enc.shape == (2, 12, 32) and out_lens.tolist() == [12, 6]


@pytest.mark.parametrize("tied", [True, False])
def test_parameters_by_formula(tied):
    model = tiny(tie_embeddings=tied)
    assert parameter_count(model.cfg) == sum(p.numel() for p in model.parameters()) == describe(model.cfg)["params"]
    assert (model.out.weight is model.embed.weight) == tied


def test_forward_flops_by_formula_equal_torchs_counter():
    model = tiny()
    for frames, labels in ((64, 5), (77, 9), (200, 1)):
        with torch.no_grad(), counter() as fc:
            enc, _ = model(torch.randn(1, frames, 93), torch.tensor([frames]))
            model.decode(torch.randint(0, 11, (1, labels + 1)), enc, torch.ones(1, enc.shape[1], dtype=torch.bool))
        assert fc.get_total_flops() == flops(model.cfg, frames, labels) > 0, (frames, labels)


def test_the_flop_models_label_squared_term_makes_the_training_count_exact():
    model = tiny()
    fit = fit_flop_model(model, "aed", 93, model.min_frames)
    assert fit.f > 0 and fit.to_dict()["fit_labels"] == [4, 12, 20] and "f U^2" in fit.to_dict()["formula"]
    for frames, labels in ((MODULUS * 5, 7), (MODULUS * 9, 33)):  # lengths the strides divide: exact
        assert fit.utterance(frames, labels) == pytest.approx(count_step_flops(model, [frames], 93, [labels]), rel=1e-9)


def test_padding_frames_and_later_labels_change_no_valid_output():
    model = tiny()
    x, lens = torch.randn(2, 90, 93), torch.tensor([90, 41])
    tokens = torch.randint(1, 11, (2, 6))
    with torch.no_grad():
        enc, out_lens = model(x, lens)
        valid = torch.arange(enc.shape[1])[None] < out_lens[:, None]
        both = model.decode(tokens, enc, valid)
        alone_enc, _ = model(x[1:, :41], lens[1:])
        alone = model.decode(tokens[1:, :4], alone_enc, torch.ones(1, alone_enc.shape[1], dtype=torch.bool))
    assert torch.allclose(both[1, :4], alone[0], atol=1e-5)  # the second utterance's padding and its later labels


def test_sinusoids_are_vaswanis():
    s = sinusoids(5, 4, torch.device("cpu"))
    assert torch.allclose(s[3], torch.tensor([torch.sin(torch.tensor(3.0)), torch.cos(torch.tensor(3.0)),
                                              torch.sin(torch.tensor(0.03)), torch.cos(torch.tensor(0.03))]))


def test_forward_and_decode_read_no_values_on_the_host():
    with torch.device("meta"):
        model = build_model(TINY)
        enc, out = model(torch.empty(3, 50, 93), torch.empty(3, dtype=torch.long))
        logits = model.decode(torch.empty(3, 4, dtype=torch.long), enc, torch.empty(3, enc.shape[1], dtype=torch.bool))
    assert enc.shape == (3, 7, 32) and logits.shape == (3, 4, 11)


def test_the_preset_is_canaries_layout_within_two_percent_of_the_published_count():
    cfg = load_preset("canary-aed-sizes").model
    assert (cfg.d_model, cfg.layers, cfg.heads, cfg.ff_mult, cfg.conv_kernel, cfg.subsampling_channels) == \
        (1024, 24, 8, 4, 9, 256)
    assert (cfg.dec_layers, cfg.dec_heads, cfg.dec_ff_mult, cfg.tie_embeddings, cfg.num_classes) == \
        (24, 8, 4, True, 1025)
    built = describe(cfg)["params"]  # on the meta device: nothing allocated
    assert built == parameter_count(cfg) == 986_706_945
    d = cfg.d_model  # NeMo's layout: Transformer-XL's positional projection and biases per encoder block
    nemo = parameter_count(cfg, classes=CANARY_TOKENS) + cfg.layers * (d * d + 2 * d)
    assert abs(nemo - PUBLISHED) / PUBLISHED < 0.02 and abs(built - PUBLISHED) / PUBLISHED < 0.02


@pytest.mark.parametrize("field, value, match", [("dec_heads", 5, "must divide model.d_model=32"),
                                                 ("dec_layers", 0, "model.dec_layers=0 must be >= 1"),
                                                 ("label_smoothing", 1.0, r"model.label_smoothing=1.0 not in \[0, 1\)"),
                                                 ("length_penalty", -1.0, "model.length_penalty=-1.0 must be >= 0"),
                                                 ("heads", 3, "model.d_model=32 must be an even multiple")])
def test_problems_name_the_field_and_value(field, value, match):
    assert any(re.search(match, m) for m in dataclasses.replace(TINY, **{field: value}).problems())
