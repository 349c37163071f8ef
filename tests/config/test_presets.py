import dataclasses

import pytest

from speechperf.config import ConfigError, RunConfig, load_preset, preset_names


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_loads_validates_and_round_trips(name):
    cfg = load_preset(name)
    assert cfg.preset == name
    assert RunConfig.from_dict(cfg.to_dict()) == cfg


def test_named_presets_exist():
    assert {"paper", "cpu", "tiny"} <= set(preset_names())


def test_paper_preset_is_spec_b():
    m = load_preset("paper").model
    assert (m.input_dim, m.conv_channels, m.conv_kernel, m.conv_stride) == (93, 600, 11, 2)
    assert (m.lstm_layers, m.lstm_hidden, m.num_classes, m.dropout, m.batch_norm) == (5, 800, 30, 0.05, True)
    t = load_preset("paper").train
    assert (t.optimizer, t.sentence_every, t.checkpoint_every, t.eval_beam, t.final_beam) == ("adadelta", 50, 250, 256, 512)
    assert load_preset("paper").loader.mode == "pad" and load_preset("paper").loader.pad_frames == 1670


def test_overrides():
    cfg = load_preset("tiny", ["lr=0.5", "model.lstm_hidden=64", "loader.mode=pad", "batch_norm=false"])
    assert (cfg.train.lr, cfg.model.lstm_hidden, cfg.loader.mode, cfg.model.batch_norm) == (0.5, 64, "pad", False)


@pytest.mark.parametrize("bad,match", [
    (["nosuch=1"], "no section"),
    (["model.nosuch=1"], "no field"),
    (["lr=fast"], "not a float"),
    (["lr"], "not key=value"),
    (["loader.mode=zigzag"], "loader.mode"),
    (["train.dropout=0.1"], "no field"),
    (["model.dropout=1.5"], "dropout"),
    (["batch_norm=maybe"], "not a bool"),
])
def test_bad_overrides_name_the_value(bad, match):
    with pytest.raises(ConfigError, match=match):
        load_preset("tiny", bad)


def test_unknown_preset_and_bad_file(tmp_path):
    with pytest.raises(ConfigError, match="unknown preset"):
        load_preset("nosuch")
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\nlstm_hidden = 'big'\n")
    with pytest.raises(ConfigError, match="lstm_hidden"):
        load_preset(str(bad))
    bad.write_text("[modle]\n")
    with pytest.raises(ConfigError, match="unknown sections"):
        load_preset(str(bad))


def test_configs_are_frozen():
    cfg = load_preset("tiny")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.model.lstm_hidden = 1
