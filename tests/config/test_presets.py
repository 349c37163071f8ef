import dataclasses

import pytest

from speechperf.config import ConfigError, RunConfig, load_preset, preset_names


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_loads_validates_and_round_trips(name):
    cfg = load_preset(name)
    assert cfg.preset == name
    assert RunConfig.from_dict(cfg.to_dict()) == cfg


def test_named_presets_exist():
    assert {"paper", "cpu", "tiny", "gpu", "modern"} <= set(preset_names())


def test_paper_preset_is_spec_b():
    m = load_preset("paper").model
    assert (m.input_dim, m.conv_channels, m.conv_kernel, m.conv_stride) == (93, 600, 11, 2)
    assert (m.lstm_layers, m.lstm_hidden, m.num_classes, m.dropout, m.batch_norm) == (5, 800, 30, 0.05, True)
    t = load_preset("paper").train
    assert (t.optim.name, t.eval.sentence_every, t.system.checkpoint_every, t.eval.beam, t.eval.final_beam) == \
        ("adadelta", 50, 250, 256, 512)
    assert load_preset("paper").loader.mode == "pad" and load_preset("paper").loader.pad_frames == 1670


def test_overrides():
    cfg = load_preset("tiny", ["lr=0.5", "model.lstm_hidden=64", "loader.mode=pad", "batch_norm=false"])
    assert (cfg.train.optim.lr, cfg.model.lstm_hidden, cfg.loader.mode, cfg.model.batch_norm) == (0.5, 64, "pad", False)


@pytest.mark.parametrize("bad,match", [
    (["nosuch=1"], "no section"),
    (["model.nosuch=1"], "no field"),
    (["lr=fast"], "not a float"),
    (["lr"], "not key=value"),
    (["loader.mode=zigzag"], "loader.mode"),
    (["train.dropout=0.1"], "no field"),
    (["model.dropout=1.5"], "dropout"),
    (["batch_norm=maybe"], "not a bool"),
    (["train.eval.mode=fastest"], "train.eval.mode='fastest' must be one of words, ngrams"),
    # values that cannot train (lr=inf once ran to a "successful" run of non-finite weights)
    (["lr=inf"], r"train\.optim\.lr=inf must be a finite number"),
    (["lr=nan"], r"train\.optim\.lr=nan must be a finite number"),
    (["lr=0"], r"train\.optim\.lr=0\.0 must be > 0"),
    (["lr_decay=0"], r"train\.schedule\.lr_decay=0\.0 must be > 0"),
    (["grad_clip=-inf"], r"train\.optim\.grad_clip=-inf must be a finite number"),
    (["weight_decay=-0.1"], r"train\.optim\.weight_decay=-0\.1 must be >= 0"),
    (["batch_size=0"], r"loader\.batch_size=0 must be >= 1"),
    (["bucket_window=0"], r"loader\.bucket_window=0 must be >= 1"),
    (["max_epochs=0"], r"train\.stop\.max_epochs=0 must be >= 1"),
    (["time_cap_minutes=nan"], r"train\.stop\.time_cap_minutes=nan must be a finite number"),
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


def test_platform_profiles_are_table_2():
    from speechperf.config import load_platform, platform_names

    assert {"sys1", "sys10", "sys2"} <= set(platform_names())  # today's machines: tests/hardware/test_platforms.py
    table2 = {"sys1": (96, 8, 40, 2605.29), "sys2": (240, 16, 100, 5699.95), "sys10": (300, 16, 100, 25999.00)}
    for name, (batch, readers, buffer, price) in table2.items():
        cfg = load_preset("paper", platform=name)
        assert (cfg.loader.batch_size, cfg.loader.readers, cfg.loader.prefetch_batches) == (batch, readers, buffer)
        assert load_platform(name)["platform"]["price_usd"] == price
    assert load_preset("paper", ["batch_size=8"], platform="sys1").loader.batch_size == 8  # overrides win
    assert load_preset("paper", platform="h100-sxm") == load_preset("paper")  # a price-only profile: no loader values
    with pytest.raises(ConfigError, match="unknown platform"):
        load_preset("paper", platform="sys99")


def test_gpu_preset_is_the_papers_model_at_its_best_precision_on_buckets():
    gpu, paper = load_preset("gpu"), load_preset("paper")
    assert gpu.model == paper.model
    assert (gpu.train.system.precision, gpu.loader.mode, gpu.train.optim.name) == ("auto", "bucket", "adadelta")
    assert gpu.train.system.sync_every > 1 and gpu.train.stop.target == 10.0


def test_modern_against_paper_differ_in_the_recipe_only():
    modern, paper = load_preset("modern"), load_preset("paper")
    assert modern.model == paper.model and modern.loader.batch_size == paper.loader.batch_size
    assert (paper.loader.mode, paper.loader.pad_frames, paper.train.system.precision, paper.train.optim.name) == \
        ("pad", 1670, "fp32", "adadelta")
    assert (modern.loader.mode, modern.train.system.precision, modern.train.optim.name, modern.train.optim.impl) == \
        ("bucket", "bf16", "adamw", "fused")
    assert not modern.train.system.compile  # an option, on only where measured faster
    assert (modern.train.stop.target_metric, modern.train.stop.target) == (paper.train.stop.target_metric, paper.train.stop.target)
    assert (modern.train.eval.beam, modern.train.eval.final_beam) == (paper.train.eval.beam, paper.train.eval.final_beam)


def test_gpu_fields_default_to_todays_cpu_behaviour():
    t = load_preset("cpu").train
    s = t.system
    assert (s.sync_every, s.deterministic, s.dist_backend, t.optim.impl, s.compile) == (1, False, "auto", "default", False)
    assert load_preset("tiny", ["deterministic=true", "compile=true"]).train.system.deterministic


@pytest.mark.parametrize("bad,match", [
    (["sync_every=0"], "train.system.sync_every=0 must be >= 1"),
    (["train.optim.impl=turbo"], "train.optim.impl='turbo'"),
    (["train.optim.name=adadelta", "train.optim.impl=fused"], "fused needs train.optim.name=adamw"),
])
def test_bad_gpu_fields(bad, match):
    with pytest.raises(ConfigError, match=match):
        load_preset("tiny", bad)


def test_a_toml_infinity_is_refused_too(tmp_path):
    bad = tmp_path / "inf.toml"
    bad.write_text("[train]\nlr = inf\n")
    with pytest.raises(ConfigError, match=r"train\.optim\.lr=inf must be a finite number"):
        load_preset(str(bad))


def test_the_gpu_presets_size_their_evaluation_batches_and_the_cpu_presets_keep_the_training_ones():
    for name in ("gpu", "conformer"):  # launch-bound forward passes: fewer, larger evaluation batches
        loader = load_preset(name).loader
        assert loader.eval_max_duration >= 4 * loader.max_duration > 0, name
    for name in ("cpu", "conformer-cpu", "tiny", "paper", "modern"):  # the references' evaluation batches
        assert load_preset(name).loader.eval_max_duration == 0.0, name
    with pytest.raises(ConfigError, match=r"loader\.eval_max_duration=-1\.0 must be >= 0"):
        load_preset("gpu", ["eval_max_duration=-1"])
    with pytest.raises(ConfigError, match=r"loader\.eval_max_duration=inf must be a finite number"):
        load_preset("gpu", ["eval_max_duration=inf"])


def test_a_run_recorded_before_evaluation_batch_sizes_loads_with_training_sized_ones():
    from pathlib import Path

    from speechperf.results.view import RunView

    folder = Path(__file__).parents[1] / "benchmarks" / "fixtures" / "gpu_check" / "runs" / "demo" / "run"
    recorded = RunView.open(folder).config  # a gpu run's config.json, written without the field
    assert "eval_max_duration" not in recorded["loader"]
    cfg = RunConfig.from_dict(recorded)
    assert (cfg.preset, cfg.loader.max_duration, cfg.loader.eval_max_duration) == ("gpu", 1440.0, 0.0)
    assert RunConfig.from_dict(cfg.to_dict()) == cfg


def test_the_training_split_is_resident_but_for_the_paper_s_loader():
    for name in ("cpu", "gpu", "conformer", "conformer-cpu"):  # epochs 2+ without reader processes
        assert load_preset(name).loader.resident is True, name
    for name in ("paper", "tiny", "modern"):  # the paper's loader streams every epoch
        assert load_preset(name).loader.resident is False, name
    assert load_preset("cpu", ["loader.resident=false"]).loader.resident is False
    with pytest.raises(ConfigError, match=r"loader\.resident"):
        load_preset("cpu", ["loader.resident=sometimes"])


def test_the_model_s_classes_must_be_the_units():
    """loader.units names the labels; the model's outputs must be their classes, blank included."""
    assert load_preset("tiny").loader.units == "char"
    with pytest.raises(ConfigError, match=r"^model\.num_classes=30 does not match loader\.units='bpe:500' \(501 "
                                          r"classes\)$"):
        load_preset("tiny", ["loader.units=bpe:500"])
    with pytest.raises(ConfigError, match=r"train\.eval\.decoder='wordbeam' searches characters"):
        load_preset("conformer-cpu", ["loader.units=bpe:256", "model.num_classes=257"])
    cfg = load_preset("conformer-cpu", ["loader.units=bpe:256", "model.num_classes=257", "train.eval.decoder=greedy"])
    assert (cfg.loader.units, cfg.model.num_classes) == ("bpe:256", 257)
    with pytest.raises(ConfigError, match=r"loader\.units='bpe500' must be 'char' or 'bpe:N'"):
        load_preset("tiny", ["loader.units=bpe500"])
