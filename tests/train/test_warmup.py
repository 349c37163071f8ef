"""The warm-up before the TTA clock leaves the model and the random streams as they were."""
import dataclasses

import pytest
import torch

from speechperf.config import load_preset
from speechperf.models import build_model
from speechperf.train.warmup import WARM_FRAMES, warm_model, warm_shape


def test_warm_model_changes_no_weight_buffer_or_rng():
    cfg = load_preset("tiny", ["threads=1"])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    warm_model(model, cfg, torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), rng)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # batch-norm statistics included
    assert all(p.grad is None for p in model.parameters())


def test_warm_shape_is_the_training_shape_for_padded_gpu_batches():
    cfg = load_preset("paper", [])
    assert warm_shape(cfg, torch.device("cuda")) == (cfg.loader.batch_size, cfg.loader.pad_frames)
    assert warm_shape(cfg, torch.device("cpu")) == (2, WARM_FRAMES)
    bucketed = dataclasses.replace(cfg, loader=dataclasses.replace(cfg.loader, mode="bucket"))
    assert warm_shape(bucketed, torch.device("cuda")) == (2, WARM_FRAMES)


def test_a_precision_the_cpu_cannot_run_is_refused_with_the_way_out(monkeypatch):
    from speechperf.config import ConfigError
    from speechperf.hardware import capability as cap
    from speechperf.train.warmup import check_precision

    monkeypatch.setenv(cap.FORCE_ENV, "avx512f")  # any CPU behaves as one without AVX-512
    cpu = torch.device("cpu")
    with pytest.raises(ConfigError) as e:
        check_precision(load_preset("tiny", ["precision=bf16"]), cpu)
    assert str(e.value) == ("train.system.precision=bf16 cannot train model ds2 here: unsupported on this CPU: torch's oneDNN "
                            "LSTM has no bf16 kernel without AVX-512 (this CPU: AVX2); use train.system.precision=fp32")
    with pytest.raises(ConfigError, match="fp16 needs a CUDA device"):
        check_precision(load_preset("tiny", ["precision=fp16"]), cpu)
    assert check_precision(load_preset("tiny"), cpu) is None


def test_an_emulated_precision_is_named(monkeypatch):
    from speechperf.hardware import capability as cap
    from speechperf.train.warmup import check_precision

    monkeypatch.setattr(cap, "_real_cpu_flags", lambda: frozenset({"avx2", "fma"}) | cap.AVX512_CORE)
    monkeypatch.setattr(cap, "probe", lambda kernel, dtype: None)  # as a CPU with AVX-512 answers
    note = check_precision(load_preset("tiny", ["precision=bf16"]), torch.device("cpu"))
    assert note == "emulated: no native bf16 on this CPU (AVX-512)"


def test_train_refuses_before_writing_anything(monkeypatch, tmp_path, capsys):
    from speechperf.cli import main
    from speechperf.hardware import capability as cap

    monkeypatch.setenv(cap.FORCE_ENV, "avx512f")
    code = main(["train", "--preset", "tiny", "--data", str(tmp_path / "feats"), "--out", str(tmp_path / "run"),
                 "train.system.precision=bf16"])
    assert code == 2 and not (tmp_path / "run").exists()
    err = capsys.readouterr().err
    assert "unsupported on this CPU: torch's oneDNN LSTM has no bf16 kernel without AVX-512" in err
    assert "use train.system.precision=fp32" in err
