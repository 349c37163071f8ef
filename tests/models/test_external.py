"""A model from outside the package: ``model.name=MODULE:NAME`` (tests/models/external_model.py
with this folder on the Python path) and an installed package's ``speechperf.models`` entry
point (a dist-info folder built here: no pip, no network), checked against the contract before
anything is written."""
import dataclasses
import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch

from speechperf.config import ConfigError, RunConfig, load_preset
from speechperf.models import MODELS, build_model, describe
from speechperf.models.contract import planned_forward
from speechperf.models.external import ModelContractError
from speechperf.registry import UnknownName
from speechperf.results.workload import _describe, workload

HERE = Path(__file__).resolve().parent
DOC = HERE.parents[1] / "docs" / "workloads.md"
EXT = "external_model:ext_conv"


def _forget(module_prefix: str) -> None:
    """Unregister what modules of ``module_prefix`` registered and drop them from sys.modules, so
    that other tests (which list every registered model) see the built-ins only."""
    for name in [k for k, v in MODELS.items() if v.build.__module__.startswith(module_prefix)]:
        del MODELS[name]
    for mod in [m for m in sys.modules if m.startswith(module_prefix)]:
        del sys.modules[mod]


@pytest.fixture
def outside(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    yield
    _forget("external_model")
    sys.modules.pop("failing_model", None)


def test_a_model_by_module_and_name_takes_overrides_and_meets_the_contract(outside):
    cfg = load_preset("tiny", ["model.hidden=16", f"model.name={EXT}"])  # the name applies first
    assert type(cfg.model).__name__ == "ExtConvConfig" and (cfg.model.name, cfg.model.hidden) == (EXT, 16)
    assert RunConfig.from_dict(cfg.to_dict()) == cfg  # config.json keeps MODULE:NAME: a resume imports it again
    model = build_model(cfg.model).eval()
    lens = torch.tensor([80, 57, 31])
    with torch.no_grad():
        log_probs, out_lens = planned_forward(model, torch.randn(3, 80, 93), lens)
    assert log_probs.shape == (int(out_lens.max()), 3, 30) and torch.equal(out_lens, (lens - 9) // 2 + 1)
    params = sum(p.numel() for p in model.parameters())
    assert describe(cfg.model) == {"model": "ext_conv", "params": params}  # tables name it by its NAME
    assert workload(cfg.to_dict())["model"] == "ext_conv"
    with pytest.raises(ConfigError, match="model.hidden=0 must be >= 1"):
        load_preset("tiny", [f"model.name={EXT}", "model.hidden=0"])
    with pytest.raises(ConfigError, match="'x' is not a int"):
        load_preset("tiny", [f"model.name={EXT}", "model.hidden=x"])
    with pytest.raises(ConfigError, match="no field 'lstm_hidden'"):
        load_preset("tiny", [f"model.name={EXT}", "model.lstm_hidden=8"])


@pytest.mark.parametrize("name, lacks", [
    ("no_such_module:ext", "no module 'no_such_module' on the Python path; PYTHONPATH names the folder"),
    ("external_model.sub:ext", "no module 'external_model.sub' on the Python path"),
    ("failing_model:ext", "module 'failing_model' fails to import: ModuleNotFoundError: No module named 'missing_dep'"),
    ("external_model:nothing", "module 'external_model' registers no model 'nothing' (it registers: ext_conv"),
    ("external_model:ds2", "module 'external_model' registers no model 'ds2'"),  # a built-in is not its own
    ("../external_model:ext_conv", "is not MODULE:NAME"),
    ("external_model:ext_no_problems", "its config NoProblemsConfig has no field 'num_classes'; its config "
                                       "NoProblemsConfig has no problems()"),
    ("external_model:ext_plain", "its model Linear has no output_lengths(); its model Linear has no plan(); "
                                 "its model Linear has no min_frames"),
    ("external_model:ext_wrong_classes", "its forward returns log-probabilities (160, 2, 29), not (T' >= 160, 2, 30)"),
])
def test_a_name_that_does_not_import_or_falls_short_is_refused_naming_what_it_lacks(outside, name, lacks):
    with pytest.raises(ModelContractError, match=re.escape(lacks)) as e:
        load_preset("tiny", [f"model.name={name}"])
    assert f"model {name!r}" in str(e.value) and e.value.exit_code == 2


def test_an_unknown_name_says_how_to_name_a_model_outside_the_package():
    with pytest.raises(UnknownName, match="known: aed, cldnn.*model.name=MODULE:NAME"):
        load_preset("tiny", ["model.name=my_encoder"])


def test_a_reader_without_the_module_still_names_the_workload():
    _describe.cache_clear()  # a module-level cache keyed by the config's JSON
    assert workload({"model": {"name": "not_on_this_path:enc", "hidden": 3}}) == {"model": "enc", "params": None}


def _doc_example() -> str:
    """The model file docs/workloads.md shows (its first python block after the section's heading)."""
    text = DOC.read_text(encoding="utf-8").split("## A model from outside the package", 1)[1]
    return text.split("```python\n", 1)[1].split("```", 1)[0]


def _install(site: Path, dist: str, entry_points: str, modules: dict[str, str]) -> None:
    """An installed distribution as importlib.metadata finds it on sys.path: a dist-info folder
    (METADATA, entry_points.txt) beside its modules."""
    info = site / f"{dist}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[speechperf.models]\n{entry_points}\n")
    for name, text in modules.items():
        (site / f"{name}.py").write_text(text)


def test_an_installed_packages_entry_point_registers_its_model_by_name(tmp_path, monkeypatch):
    site = tmp_path / "site"
    _install(site, "my_encoder_dist", "my_encoder = my_encoder", {"my_encoder": _doc_example()})
    _install(site, "broken_dist", "broken = broken_encoder", {"broken_encoder": "raise RuntimeError('no GPU here')\n"})
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(MODELS, "_loaded", False)  # load again: the entry points now installed
    monkeypatch.setattr(MODELS, "broken", [])
    try:
        cfg = load_preset("tiny", ["model.name=my_encoder", "model.hidden=8"])
        assert dataclasses.asdict(cfg.model) == {"name": "my_encoder", "input_dim": 93, "hidden": 8, "num_classes": 30}
        assert describe(cfg.model)["model"] == "my_encoder" and "my_encoder" in MODELS.names()
        with pytest.raises(UnknownName, match=r"fail to import: broken = broken_encoder \(package broken_dist\): "
                                              r"RuntimeError: no GPU here"):
            load_preset("tiny", ["model.name=broken"])
    finally:
        _forget("my_encoder")
        sys.modules.pop("broken_encoder", None)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_entry_point_model_trains_through_the_cli_by_its_name(tiny_features, tmp_path):
    """``model.name=NAME`` is enough in a new process where a package declares the entry point."""
    from tests.conftest import cli

    site, run = tmp_path / "site", tmp_path / "run"
    _install(site, "my_encoder_dist", "my_encoder = my_encoder", {"my_encoder": _doc_example()})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    train = ["train", "--preset", "tiny", "--data", tiny_features, "--out", run, "threads=1", "max_epochs=1",
             "train.eval.decoder=greedy", "model.name=my_encoder"]
    p = cli(*train, "model.hidden=0", env=env)
    assert (p.returncode, p.stderr.strip()) == (2, "speechperf: error: model.hidden=0 must be >= 1") and not run.exists()
    p = cli(*train, "model.hidden=8", "--json", env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert json.loads((run / "config.json").read_text())["model"] == {"name": "my_encoder", "input_dim": 93,
                                                                      "hidden": 8, "num_classes": 30}
    assert json.loads((run / "summary.json").read_text())["mfu_pct"] > 0
