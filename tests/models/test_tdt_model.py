"""The transducer with TDT durations (models/rnnt.py ``durations``): the joint's extra duration logits,
parameters and FLOPs by formula against the built model and torch's counter, an RNN-T's init
unchanged by the new field, the ``parakeet-tdt-sizes`` preset, and bad duration lists refused."""
import dataclasses

import pytest
import torch

from speechperf.config import load_preset
from speechperf.models import build_model, describe, model_config
from speechperf.models.rnnt import durations_of, flops, parameter_count
from speechperf.hardware.mfu import counter

TINY = {"name": "transducer", "encoder": "fastconformer", "subsampling": 8, "d_model": 32, "layers": 2, "heads": 2,
        "subsampling_channels": 8, "pred_dim": 12, "pred_layers": 2, "joint_dim": 10, "num_classes": 9,
        "dropout": 0.0, "attention_dropout": 0.0, "pred_dropout": 0.0}


def tiny(**kw):
    torch.manual_seed(0)
    return build_model(model_config({**TINY, **kw}))


def test_the_joint_emits_tokens_then_durations():
    model = tiny(durations="0,1,2,3,4").eval()
    enc, _ = model(torch.randn(2, 90, 93), torch.tensor([90, 41]))
    g, _ = model.predict(torch.randint(1, 9, (2, 3)))
    assert model.joint(enc[:, :, None], g[:, None]).shape == (2, 12, 4, 9 + 5)
    assert durations_of(model.cfg) == (0, 1, 2, 3, 4) and durations_of(tiny().cfg) == ()


def test_an_rnnt_is_built_as_before_and_a_tdt_differs_only_in_its_output_layer():
    rnnt, tdt = tiny().state_dict(), tiny(durations="1,2,3,4").state_dict()
    assert rnnt.keys() == tdt.keys() and rnnt["out.weight"].shape == (9, 10) and tdt["out.weight"].shape == (13, 10)
    assert all(torch.equal(rnnt[k], tdt[k]) for k in rnnt if not k.startswith("out."))  # same draws before it


@pytest.mark.parametrize("durations", ["0,1,2,3,4", "1,2"])
def test_parameters_and_flops_by_formula(durations):
    model = tiny(durations=durations)
    assert parameter_count(model.cfg) == sum(p.numel() for p in model.parameters()) == describe(model.cfg)["params"]
    model.eval()
    for frames, labels in ((64, 5), (77, 9)):
        with torch.no_grad(), counter() as fc:
            enc, _ = model(torch.randn(1, frames, 93), torch.tensor([frames]))
            g, _ = model.predict(torch.randint(1, 9, (1, labels)))
            model.joint(enc[:, :, None], g[:, None])
        assert fc.get_total_flops() == flops(model.cfg, frames, labels) > flops(tiny().cfg, frames, labels)


def test_the_preset_is_parakeet_rnnt_sizes_plus_five_duration_logits():
    tdt, rnnt = load_preset("parakeet-tdt-sizes").model, load_preset("parakeet-rnnt-sizes").model
    assert durations_of(tdt) == (0, 1, 2, 3, 4) and rnnt.durations == ""
    assert dataclasses.replace(tdt, durations="") == rnnt
    assert describe(tdt)["params"] == parameter_count(tdt) == 591_477_249 + 5 * 640 + 5


@pytest.mark.parametrize("bad", ["0,2", "1,1", "-1,1", "a,b", "0"])
def test_bad_durations_are_refused_naming_them(bad):
    assert any(f"model.durations={bad!r} must be" in m for m in model_config({**TINY, "durations": bad}).problems())


@pytest.mark.parametrize("sigma, omega", [(0.0, 0.0), (0.05, 0.0), (0.0, 0.1), (0.02, 0.3)])
def test_sigma_and_omega_are_the_loss_s_and_the_mixture_with_the_token_logits_rnnt(sigma, omega):
    from speechperf.objectives.rnnt_reference import rnnt_loss_reference
    from speechperf.objectives.tdt import head_loss
    from speechperf.objectives.tdt_reference import tdt_loss_reference

    model = tiny(durations="0,1,2", tdt_sigma=sigma, tdt_omega=omega).eval()
    torch.manual_seed(1)
    logits = torch.randn(2, 6, 4, 9 + 3, dtype=torch.float64)
    targets, frames, labels = torch.randint(1, 9, (2, 3)), torch.tensor([6, 4]), torch.tensor([3, 2])
    got = head_loss(model, logits, targets, frames, labels)
    tdt = tdt_loss_reference(logits, targets, frames, labels, (0, 1, 2), sigma=sigma)
    rnnt = rnnt_loss_reference(logits[..., :9], targets, frames, labels)
    assert torch.allclose(got, (1 - omega) * tdt + omega * rnnt, atol=1e-9)
    if omega:
        assert not torch.allclose(got, tdt)


@pytest.mark.parametrize("field, value, says", [("tdt_sigma", -0.1, "not in [0, 1)"), ("tdt_omega", 1.0, "not in [0, 1)")])
def test_bad_sigma_or_omega_is_refused_naming_it(field, value, says):
    assert any(f"model.{field}={value} {says}" in m
               for m in model_config({**TINY, "durations": "0,1", field: value}).problems())


def test_sigma_or_omega_without_durations_is_refused():
    msgs = model_config({**TINY, "tdt_omega": 0.1}).problems()
    assert any("model.tdt_omega=0.1 needs model.durations" in m for m in msgs)
