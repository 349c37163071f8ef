"""TrainConfig in documented sections: every key documented as data, shown by --help and
docs/presets.md, and the flat keys of the release before the sections read at their new place
(config/training/moved.py) on the command line, in a preset, in a stored config and in a recipe."""
import dataclasses
import json
from pathlib import Path

import pytest

from speechperf.cli import main
from speechperf.config import ConfigError, RunConfig, load_preset
from speechperf.config.training import TrainConfig, key_markdown, key_table
from speechperf.config.training.moved import MOVED, upgrade_key, upgrade_train
from speechperf.results import upgrade

ROOT = Path(__file__).resolve().parents[2]
# TrainConfig's 43 flat fields before the sections (commit 2bc5a7c): the table must place each one
OLD_FIELDS = """protocol seed optimizer lr weight_decay warmup_iters lr_schedule lr_decay lr_step_epochs lr_min grad_clip
max_epochs time_cap_minutes stop_after_epochs sentence_every checkpoint_every train_splits eval_split final_splits
eval_decoder eval_beam eval_mode eval_threads eval_resident_mb final_beam target_metric target target_epochs precision
device dist_backend deterministic sync_every optimizer_impl floor_steps floor_window compile cuda_graphs graph_frames
graph_batch threads max_bad_losses max_skipped_fraction""".split()
# keys added after the sections (no flat field before them)
KEYS_SINCE = ["train.system.ctc_kernel"]
# A run folder of the release before the sections (the GPU check's demo run): its flat config.json
OLD_RUN = ROOT / "tests" / "benchmarks" / "fixtures" / "gpu_check" / "runs" / "demo" / "run"


def _at(obj, path: str):
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


def test_every_old_field_has_one_new_place_and_every_key_one_old_field():
    assert len(OLD_FIELDS) == 43 and sorted(MOVED) == sorted(OLD_FIELDS)
    keys = [k for k, _, _ in key_table()]
    moved = sorted(f"train.{v}" for v in MOVED.values())
    assert sorted(set(keys) - set(KEYS_SINCE)) == moved and len(set(keys)) == 43 + len(KEYS_SINCE)
    for old, new in MOVED.items():  # the default moved with the field
        assert _at(TrainConfig(), new) is not None and upgrade_key(f"train.{old}") == f"train.{new}"
    assert upgrade_key("train.optim.lr") == "train.optim.lr" and upgrade_key("model.lr") == "model.lr"


def test_every_key_is_documented_and_the_sections_are_what_a_reader_looks_for():
    assert all(doc.strip() for _, _, doc in key_table())
    sections = [f.name for f in dataclasses.fields(TrainConfig) if dataclasses.is_dataclass(f.default_factory)]
    assert sections == ["optim", "schedule", "eval", "stop", "system", "floor"]
    assert ("train.optim.lr", 1.0) in [(k, d) for k, d, _ in key_table()]


def test_docs_presets_holds_the_generated_key_table():
    text = (ROOT / "docs" / "presets.md").read_text()
    table = text.split("<!-- train keys: generated -->\n", 1)[1].split("\n<!-- train keys: end -->", 1)[0]
    assert table == key_markdown(), "docs/presets.md's key table is stale: paste config.training.key_markdown()"


def test_train_help_lists_every_key_with_its_default(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for key, default, doc in key_table():
        assert f"{key} = {default!r}" in text and " ".join(doc.split()[:4]) in text


def test_an_old_override_is_read_at_its_new_place_with_a_note(capsys):
    old = load_preset("tiny", ["train.lr=0.5", "eval_decoder=greedy", "train.stop_after_epochs=2"])
    err = capsys.readouterr().err
    assert "train.lr is now train.optim.lr" in err and "eval_decoder is now train.eval.decoder" in err
    assert old == load_preset("tiny", ["train.optim.lr=0.5", "train.eval.decoder=greedy", "train.stop.after_epochs=2"])
    assert capsys.readouterr().err == ""  # this release's keys: no note
    assert load_preset("tiny", ["threads=2"]).train.system.threads == 2  # bare: the field it always named
    with pytest.raises(ConfigError, match="train has no field 'optim.nosuch'"):
        load_preset("tiny", ["train.optim.nosuch=1"])
    with pytest.raises(ConfigError, match="train has no field 'nosuch'"):
        load_preset("tiny", ["train.nosuch=1"])


def test_a_preset_of_flat_train_keys_is_read_with_a_note(tmp_path, capsys):
    old = tmp_path / "old.toml"
    old.write_text('[model]\nconv_channels = 32\n[train]\noptimizer = "adamw"\nlr = 0.003\nseed = 4\n')
    new = tmp_path / "new.toml"
    new.write_text('[model]\nconv_channels = 32\n[train]\nseed = 4\n[train.optim]\nname = "adamw"\nlr = 0.003\n')
    assert load_preset(str(old)).train == load_preset(str(new)).train
    assert "[train] lr, optimizer: keys of an earlier release, read as train.optim.lr, train.optim.name" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text('[train.optim]\nnosuch = 1\n')
    with pytest.raises(ConfigError, match=r"\[train.optim\] unknown keys \['nosuch'\]"):
        load_preset(str(bad))


def test_an_old_config_json_and_checkpoint_config_load_into_the_same_values():
    recorded = json.loads((OLD_RUN / "config.json").read_text())
    flat = recorded["train"]
    assert set(flat) <= set(OLD_FIELDS) and "lr" in flat  # the fixture is of the flat release
    cfg = RunConfig.from_dict(upgrade.config(recorded))  # as RunView.config and a checkpoint's (evaluate_run) read it
    for old, value in flat.items():
        assert _at(cfg.train, MOVED[old]) == value, old
    assert upgrade.config(cfg.to_dict()) == cfg.to_dict()  # this release's: unchanged
    assert upgrade_train(flat) == upgrade.config(recorded)["train"]


def test_an_old_reference_recipe_reads_as_this_release_s_keys():
    ref = json.loads((ROOT / "speechperf" / "config" / "rcp" / "tiny.json").read_text())
    assert "train.lr" in ref["recipe"]  # the committed file keeps the flat keys: read through the table
    keys = {k for k, _, _ in key_table()}
    read = upgrade.recipe(ref["recipe"])
    assert read["train.optim.lr"] == ref["recipe"]["train.lr"]
    assert {k for k in read if k.startswith("train.")} <= keys
    assert upgrade.overrides(["train.final_splits=none", "loader.readers=0"]) == \
        ["train.eval.final_splits=none", "loader.readers=0"]
