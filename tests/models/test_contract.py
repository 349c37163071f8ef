"""Every registered model meets the contract of speechperf.models.contract."""
import dataclasses

import pytest
import torch

from speechperf.config import ConfigError, load_preset
from speechperf.models import MODELS, build_model, config_class, describe, model_config
from speechperf.models.contract import AcousticModel, TooShortError, planned_forward
from speechperf.registry import UnknownName

# small sizes per model, so that every registered model runs in a fraction of a second
SMALL = {
    "ds2": {"conv_channels": 8, "lstm_layers": 1, "lstm_hidden": 8},
    "dnn": {"hidden": 16, "layers": 2},
    "cldnn": {"conv_maps": 4, "lstm_cells": 8, "lstm_proj": 4, "dnn_hidden": 8},
    "conformer": {"d_model": 16, "layers": 1, "heads": 2, "conv_kernel": 3, "subsampling_channels": 4},
    "fastconformer": {"d_model": 16, "layers": 1, "heads": 2, "conv_kernel": 3, "subsampling_channels": 4},
    "transducer": {"d_model": 16, "layers": 1, "heads": 2, "conv_kernel": 3, "subsampling_channels": 4,
                   "pred_dim": 8, "joint_dim": 8},
    "aed": {"d_model": 16, "layers": 1, "heads": 2, "conv_kernel": 3, "subsampling_channels": 4, "dec_layers": 1,
            "dec_heads": 2},
}


def small(name: str) -> AcousticModel:
    torch.manual_seed(0)
    return build_model(model_config({"name": name, **SMALL.get(name, {})}))


@pytest.mark.parametrize("name", MODELS.names())
def test_every_model_meets_the_contract(name):
    model = small(name).eval()
    assert isinstance(model, AcousticModel) and model.cfg.name == name
    lens = torch.tensor([80, 57, 31])
    x = torch.randn(3, 80, 93)  # (B, T, 93): the loader's features
    out_lens, planned = model.plan(lens, 80)
    assert out_lens.dtype == torch.int64 and out_lens.device.type == "cpu"
    assert torch.equal(out_lens, model.output_lengths(lens))
    with torch.no_grad():
        log_probs, got_lens = planned_forward(model, x, lens)
    assert torch.equal(got_lens, out_lens)
    if hasattr(model, "joint"):  # a transducer: the encoder output its joint reads (tests/models/test_transducer.py)
        assert log_probs.shape == (3, int(out_lens.max()), model.cfg.joint_dim)  # (B, T', J)
    elif hasattr(model, "decode"):  # an attention encoder-decoder: the encoder frames its decoder attends to
        assert log_probs.shape == (3, int(out_lens.max()), model.cfg.d_model)  # (B, T', D)
    else:
        assert log_probs.shape == (int(out_lens.max()), 3, model.cfg.num_classes)  # (T', B, C)
        assert torch.allclose(log_probs.exp().sum(-1), torch.ones(log_probs.shape[:2]), atol=1e-4)
    if model.min_frames > 1:
        with pytest.raises(TooShortError, match=f"needs at least {model.min_frames}"):
            model.plan(torch.tensor([80, model.min_frames - 1]), 80)


@pytest.mark.parametrize("name", MODELS.names())
def test_every_config_is_frozen_named_and_checked(name):
    kind = config_class(name)
    cfg = kind()
    assert dataclasses.is_dataclass(cfg) and cfg.name == name and cfg.problems() == []
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.name = "other"
    assert model_config(dataclasses.asdict(cfg)) == cfg  # stored as a dict tagged with its name
    assert describe(dataclasses.asdict(cfg))["params"] == sum(p.numel() for p in build_model(cfg).parameters())


def test_model_name_override_switches_to_that_models_fields():
    cfg = load_preset("tiny", ["model.hidden=64", "model.name=dnn"])  # name applies first, in any order
    assert cfg.model == model_config({"name": "dnn", "hidden": 64})
    with pytest.raises(ConfigError, match="no field 'conv_channels'"):
        load_preset("tiny", ["model.name=dnn", "model.conv_channels=3"])
    with pytest.raises(UnknownName, match="unknown model 'nope'; known: aed, cldnn"):
        load_preset("tiny", ["model.name=nope"])
    with pytest.raises(ConfigError, match="model.lstm_hidden=0 must be >= 1"):
        load_preset("tiny", ["model.lstm_hidden=0"])


def test_a_name_registered_twice_is_refused():
    from speechperf.models import register_model
    from speechperf.models.dnn import DNNConfig

    with pytest.raises(ValueError, match="model 'dnn' registered twice"):
        register_model("dnn", DNNConfig)(lambda cfg: None)


@pytest.mark.cuda
@pytest.mark.parametrize("name", MODELS.names())
def test_a_planned_forward_on_cuda_from_cpu_tensors_does_not_wait_for_the_device(name):
    import warnings

    from speechperf.models.contract import to_device
    from tests.cuda_syncs import sync_warnings

    dev = torch.device("cuda", 0)
    model = small(name).eval().to(dev)
    lens, x = torch.tensor([80, 57, 31]), torch.randn(3, 80, 93)  # pageable CPU tensors, as a streamed batch's
    pinned = to_device(lens, dev)
    assert pinned.device == dev and torch.equal(pinned.cpu(), lens)
    with torch.no_grad():
        planned_forward(model, x, lens, dev)  # warm-up: cuDNN handles, the pinned host pool
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                log_probs, _ = planned_forward(model, x, lens, dev)
            finally:
                torch.cuda.set_sync_debug_mode(0)
    assert not sync_warnings(caught)
    with torch.no_grad():
        assert torch.allclose(log_probs.cpu(), planned_forward(model.cpu(), x, lens)[0], atol=1e-2)  # TF32 convolutions


def test_a_model_of_blocks_compiles_each_block_once_for_every_shape():
    """train.system.compile on the conformer: each block compiled in place with dynamic shapes, so dynamo
    traces the block's code once for all blocks and all batch shapes (backend "eager": dynamo's
    graphs without inductor's code generation, seconds instead of minutes); outputs and gradients
    equal the plain model's bit for bit; the parameters keep their names."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from speechperf.config import load_preset
    from speechperf.models import build_model
    from speechperf.models.contract import compiled

    graphs = []
    for layers in (2, 3):
        torch._dynamo.reset()
        counters.clear()
        cfg = load_preset("conformer-cpu", [f"model.layers={layers}", "model.d_model=16", "model.heads=2",
                                            "model.subsampling_channels=8"])
        torch.manual_seed(0)
        model, plain = build_model(cfg.model), build_model(cfg.model)
        plain.load_state_dict(model.state_dict())
        names = [n for n, _ in model.named_parameters()]
        assert compiled(model, backend="eager") is model and [n for n, _ in model.named_parameters()] == names
        for b, t in ((3, 40), (5, 64)):  # two batch shapes: no new graph for the second
            x, lens = torch.randn(b, t, 93), torch.tensor([t] + [t - 3] * (b - 1))
            outs = []
            for m in (model, plain):
                torch.manual_seed(1)  # the same dropout draws
                y, _ = m(x, lens)
                y.sum().backward()
                outs.append(y)
            assert torch.equal(*outs)
            assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), plain.parameters()))
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] == graphs[1] > 0  # a third block adds no graph; nor did the second shape


def test_a_model_without_blocks_is_compiled_whole():
    from speechperf.models.contract import compiled

    model = torch.nn.Linear(2, 2)
    assert compiled(model, backend="eager")._orig_mod is model


@pytest.mark.parametrize("name", MODELS.names())
def test_no_models_training_pass_on_a_cpu_calls_an_op_whose_code_follows_the_maker(name):
    """Every dropout on (0.1): a forward and backward pass in training calls none of the ops whose CPU
    code torch chooses by the CPU's maker (hardware/op_trace.BY_MAKER: torch's dropout draws its
    mask with MKL on Intel only), so a seed trains alike on Intel and AMD as far as the code goes."""
    from speechperf.hardware.op_trace import OpTrace, by_maker
    cfg = model_config({"name": name, **SMALL.get(name, {})})
    rates = {f.name: 0.1 for f in dataclasses.fields(cfg) if "dropout" in f.name}
    torch.manual_seed(0)
    model = build_model(dataclasses.replace(cfg, **rates)).train()
    lens = torch.tensor([80, 57, 31])
    with OpTrace() as trace:
        out, _ = planned_forward(model, torch.randn(3, 80, 93), lens)
        out.float().square().mean().backward()
    assert by_maker(trace.ops) == {}, (name, rates)
