"""The transducer on the FastConformer encoder (models/rnnt.py ``encoder="fastconformer"``): the
encoder is FastConformer's own, parameters and FLOPs by formula against the built model and torch's
counter, and the ``parakeet-rnnt-sizes`` preset against Parakeet-TDT 0.6B's published count."""
import pytest
import torch

from speechperf.config import load_preset
from speechperf.models import build_model, describe, model_config
from speechperf.models.fastconformer import FastConformerEncoder
from speechperf.models.rnnt import flops, parameter_count
from speechperf.hardware.mfu import counter

TINY = {"name": "transducer", "encoder": "fastconformer", "subsampling": 8, "d_model": 32, "layers": 2, "heads": 2,
        "subsampling_channels": 8, "pred_dim": 12, "pred_layers": 2, "joint_dim": 10, "num_classes": 9,
        "dropout": 0.0, "attention_dropout": 0.0, "pred_dropout": 0.0}
# Published (read 2026-12): nvidia/parakeet-tdt-0.6b-v2's model card, "a 600-million-parameter" model:
# FastConformer-XL, a prediction network of 2 x 640 LSTM, a joint of 640, 1,024 SentencePiece pieces
PUBLISHED = 600e6


def tiny(**kw):
    torch.manual_seed(0)
    return build_model(model_config({**TINY, **kw}))


def test_the_encoder_is_the_fastconformers_and_its_lengths():
    model = tiny().eval()
    assert type(model.encoder) is FastConformerEncoder
    enc, out_lens = model(torch.randn(2, 90, 93), torch.tensor([90, 41]))
    assert enc.shape == (2, 12, 10) and out_lens.tolist() == [12, 6]  # 8x: (L - 1) // 2 + 1 three times


def test_parameters_and_flops_by_formula():
    model = tiny()
    assert parameter_count(model.cfg) == sum(p.numel() for p in model.parameters()) == describe(model.cfg)["params"]
    model.eval()
    for frames, labels in ((64, 5), (77, 9)):
        with torch.no_grad(), counter() as fc:
            enc, _ = model(torch.randn(1, frames, 93), torch.tensor([frames]))
            g, _ = model.predict(torch.randint(1, 9, (1, labels)))
            model.joint(enc[:, :, None], g[:, None])
        assert fc.get_total_flops() == flops(model.cfg, frames, labels) > 0


def test_the_preset_is_parakeets_layout_within_two_percent_of_the_published_count():
    cfg = load_preset("parakeet-rnnt-sizes").model
    assert (cfg.encoder, cfg.d_model, cfg.layers, cfg.heads, cfg.conv_kernel, cfg.subsampling_channels) == \
        ("fastconformer", 1024, 24, 8, 9, 256)
    assert (cfg.pred, cfg.pred_layers, cfg.pred_dim, cfg.joint_dim, cfg.num_classes) == ("lstm", 2, 640, 640, 1025)
    built = describe(cfg)["params"]  # on the meta device: nothing allocated
    assert built == parameter_count(cfg) == 591_477_249
    assert abs(built - PUBLISHED) / PUBLISHED < 0.02
    d = cfg.d_model  # NeMo's layout adds Transformer-XL's positional projection and biases per block: 616.7 M
    assert abs(built + cfg.layers * (d * d + 2 * d) - PUBLISHED) / PUBLISHED < 0.03


def test_a_fastconformer_encoder_needs_8x():
    bad = model_config({**TINY, "subsampling": 4}).problems()
    assert any("model.subsampling=4 must be 8 for model.encoder=fastconformer" in m for m in bad)
