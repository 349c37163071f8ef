"""FastConformer-CTC: the sizes, parameters and FLOPs by formula against the built model, a
FLOP counter and the published counts; the encoder apart from the head; checkpointing."""
import dataclasses

import pytest
import torch

from speechperf.config import load_preset
from speechperf.models import MODELS, build_model, describe
from speechperf.models.contract import planned_forward
from speechperf.models.fastconformer import (FastConformerConfig, flops_per_audio_second, nemo_parameter_count,
                                             parameter_count, training_flops)
from speechperf.hardware.mfu import count_step_flops

TINY = FastConformerConfig(d_model=32, layers=2, heads=2, subsampling_channels=8)
# Published counts (model cards and NeMo's recipe, read 2026-12):
# - stt_en_fastconformer_ctc_large: "around 115M parameters" (its Hugging Face / NGC model card); NeMo's
#   examples/asr/conf/fastconformer/fast-conformer_ctc_bpe.yaml builds it with n_layers 18 (its table's
#   "Large (120M), 17 layers" matches neither: 17 layers are 109.3 M at NeMo's layout)
# - parakeet-ctc-0.6b: "0.6B" / 600 M parameters (its Hugging Face model card), FastConformer-XL + CTC
PUBLISHED = {"fastconformer-l": 115e6, "fastconformer-xl": 600e6}


def test_registered_with_its_config():
    assert MODELS.lookup("fastconformer").config is FastConformerConfig


@pytest.mark.parametrize("preset,sizes", [("fastconformer-l", (512, 18, 8, 9, 256)),
                                          ("fastconformer-xl", (1024, 24, 8, 9, 256))])
def test_presets_are_nemos_sizes_and_the_formula_counts_the_built_model(preset, sizes):
    cfg = load_preset(preset).model
    assert (cfg.d_model, cfg.layers, cfg.heads, cfg.conv_kernel, cfg.subsampling_channels) == sizes
    assert cfg.ff_mult * cfg.d_model == 4 * cfg.d_model
    assert describe(cfg)["params"] == parameter_count(cfg)  # built on the meta device: nothing allocated


@pytest.mark.parametrize("preset", PUBLISHED)
def test_nemos_layout_is_within_two_percent_of_the_published_count(preset):
    cfg = load_preset(preset).model
    ours = nemo_parameter_count(cfg)
    assert abs(ours - PUBLISHED[preset]) / PUBLISHED[preset] < 0.02, ours
    d = cfg.d_model  # the difference is exactly RoPE's missing positional projection and the vocabulary
    assert ours - parameter_count(cfg) == cfg.layers * (d * d + 2 * d) + (d + 1) * (1025 - cfg.num_classes)


@pytest.mark.parametrize("frames", [57, 160, 333])
def test_training_flops_formula_equals_torchs_counter(frames):
    torch.manual_seed(0)
    model = build_model(TINY)
    assert training_flops(TINY, frames) == count_step_flops(model, [frames], 93)


def test_flops_per_audio_second_grow_with_the_utterance_length():
    cfg = load_preset("fastconformer-xl").model
    short, long = flops_per_audio_second(cfg, 4.0), flops_per_audio_second(cfg, 16.0)
    assert 40e9 < short < long < 50e9  # attention's share grows with the length


def test_encode_is_the_forward_without_the_head():
    torch.manual_seed(0)
    model = build_model(TINY).eval()
    x, lens = torch.randn(2, 90, 93), torch.tensor([90, 41])
    with torch.no_grad():
        h, out_lens = model.encode(x, lens)
        log_probs, _ = planned_forward(model, x, lens)
    assert h.shape == (2, 12, 32) and out_lens.tolist() == [12, 6]
    assert torch.allclose(model.head(h).transpose(0, 1).log_softmax(-1), log_probs)


def test_activation_checkpointing_gives_the_same_gradients():
    x, lens = torch.randn(2, 90, 93), torch.tensor([90, 41])
    grads = []
    for ck in (False, True):
        torch.manual_seed(0)
        model = build_model(dataclasses.replace(TINY, activation_checkpointing=ck)).train()
        torch.manual_seed(1)  # the same dropout draws: checkpoint restores the RNG state for its recompute
        planned_forward(model, x, lens)[0].sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5)


def test_bad_sizes_name_the_field():
    bad = FastConformerConfig(d_model=30, heads=4, conv_kernel=8).problems()
    assert any("model.d_model=30" in m for m in bad) and any("model.conv_kernel=8" in m for m in bad)
