"""train.system.precision=auto: the fastest native precision, measured on the run's own step, cached per
machine, build and workload, recorded by the run and kept by a resumed one. Proven on any CPU by
forcing the CPU's flags (hardware/capability.py) and replacing the step timer."""
import json
import os
import signal

import pytest
import torch

from speechperf.cli import main
from speechperf.config import ConfigError, load_preset, preset_names
from speechperf.drive.reproduce import child_command, recipe_precision
from speechperf.results.view import RunView
from speechperf.hardware import capability as cap
from speechperf.train import auto_precision as ap
from speechperf.train import loop
from speechperf.train.admission import _as_recorded
from speechperf.train.request import TrainRequest
from speechperf.train.stop import Interrupted
from speechperf.train.warmup import check_precision

CPU = torch.device("cpu")
AVX2 = frozenset({"sse", "sse2", "avx", "avx2", "fma"})
BF16 = AVX2 | cap.AVX512_CORE | {"avx512_bf16"}


@pytest.fixture
def flags(monkeypatch):
    """Pretend to be a CPU with the given flags; its probes pass (bf16 kernels run)."""
    def set_flags(f):
        monkeypatch.setattr(cap, "_real_cpu_flags", lambda: frozenset(f))
        monkeypatch.setattr(cap, "probe", lambda kernel, dtype: None)
    return set_flags


@pytest.fixture
def timer(monkeypatch):
    """Replace the step timer: ``set(fp32=s, bf16=s)``; ``calls`` lists the precisions timed. The
    measurement counts as taken on a quiet machine (the suite's other worker would make it contended)."""
    calls = []
    monkeypatch.setattr(ap, "contended", lambda pct, threads: False)

    def set_times(**seconds):
        def fake(cfg, device, precisions, shape):
            calls.append(list(precisions))
            return {p: seconds[p] for p in precisions}
        monkeypatch.setattr(ap, "time_candidates", fake)
    set_times.calls = calls
    return set_times


def tiny(*overrides):
    return load_preset("tiny", ["train.system.precision=auto", *overrides])


def test_without_native_bf16_auto_picks_fp32_without_measuring(monkeypatch, timer, tmp_path):
    monkeypatch.setenv(cap.FORCE_ENV, "avx512f,avx512_bf16,amx_bf16")
    timer(fp32=1.0, bf16=0.1)
    choice = ap.choose(tiny(), CPU, cache=tmp_path)
    assert choice["chosen"] == "fp32" and choice["candidates"] == {} and timer.calls == []
    assert "no other precision runs natively here (bf16: unsupported on this CPU" in choice["note"]
    assert not (tmp_path / ap.CACHE_FILE).exists()


def test_auto_picks_the_faster_measured_one_and_the_cache_is_reused(flags, timer, tmp_path):
    flags(BF16)
    timer(fp32=0.4, bf16=0.25)
    first = ap.choose(tiny(), CPU, cache=tmp_path)
    assert first["chosen"] == "bf16" and first["candidates"] == {"fp32": 0.4, "bf16": 0.25} and not first["cached"]
    assert timer.calls == [["fp32", "bf16"]] and first["not_native"] == {
        "fp16": "its loss scaler is CUDA's", "fp8": "unsupported on this CPU: no Linear layer of this model can train in "
        "float8 (fc: out_features 30 not a multiple of 16): it would train in bf16"}
    timer(fp32=0.1, bf16=9.0)  # a second measurement would pick fp32
    again = ap.choose(tiny(), CPU, cache=tmp_path)
    assert (again["chosen"], again["cached"], again["candidates"]) == ("bf16", True, first["candidates"])
    assert timer.calls == [["fp32", "bf16"]]  # read from the cache, not measured
    assert ap.choose(tiny("loader.batch_size=3"), CPU, cache=tmp_path)["chosen"] == "fp32"  # another batch shape
    assert len(json.loads((tmp_path / ap.CACHE_FILE).read_text())) == 2


def test_another_step_code_measures_again(flags, timer, monkeypatch, tmp_path):
    """The cached step seconds are of the code that measured them: a speechperf whose models,
    objectives or training step differ measures its own."""
    flags(BF16)
    timer(fp32=0.4, bf16=0.25)
    assert ap.choose(tiny(), CPU, cache=tmp_path)["cached"] is False
    assert ap.choose(tiny(), CPU, cache=tmp_path)["cached"] is True
    digest = ap.step_code_digest()
    assert len(digest) == 12 and digest in ap.cache_key(tiny(), CPU, ["fp32", "bf16"], (2, 60))
    monkeypatch.setattr(ap, "step_code_digest", lambda: "0" * 12)
    again = ap.choose(tiny(), CPU, cache=tmp_path)
    assert again["cached"] is False and len(timer.calls) == 2


def test_fp32_wins_where_it_is_faster_and_a_contended_measurement_is_not_cached(flags, timer, monkeypatch, tmp_path):
    flags(BF16)
    timer(fp32=0.2, bf16=0.5)
    monkeypatch.setattr(ap, "contended", lambda pct, threads: True)
    choice = ap.choose(tiny(), CPU, cache=tmp_path)
    assert choice["chosen"] == "fp32" and "not cached" in choice["note"]
    assert not (tmp_path / ap.CACHE_FILE).exists()
    (tmp_path / ap.CACHE_FILE).write_text("{not json")  # unreadable: measured again, rewritten
    monkeypatch.setattr(ap, "contended", lambda pct, threads: False)
    assert ap.choose(tiny(), CPU, cache=tmp_path)["cached"] is False and len(timer.calls) == 2
    assert ap.choose(tiny(), CPU, cache=tmp_path)["cached"] is True


def test_the_real_timer_times_each_candidate_on_a_typical_batch():
    cfg = tiny("threads=1")
    assert ap.typical_shape(cfg) == (cfg.loader.batch_size, ap.TYPICAL_FRAMES)
    assert ap.typical_shape(load_preset("paper")) == (load_preset("paper").loader.batch_size, 1670)  # pad mode
    times = ap.time_candidates(cfg, CPU, ["fp32"], (2, 60))
    assert set(times) == {"fp32"} and times["fp32"] > 0


def test_the_machine_comparing_presets_default_to_auto_and_a_given_precision_wins():
    for name in ("cpu", "conformer-cpu", "gpu", "conformer"):
        assert load_preset(name).train.system.precision == "auto", name
    assert load_preset("cpu", ["train.system.precision=fp32"]).train.system.precision == "fp32"
    assert load_preset("tiny").train.system.precision == "fp32"  # the tests' preset and its bit-for-bit reference
    assert set(preset_names()) >= {"cpu", "conformer-cpu", "gpu", "conformer"}


def test_reproduce_trains_in_the_reference_precision():
    ref = {"recipe": {"train.system.precision": "fp32"}}
    cmd = child_command("cpu", "F", 1, 2, "O", [], precision=recipe_precision(ref))
    assert "train.system.precision=fp32" in cmd and cmd.index("train.system.precision=fp32") > cmd.index("--json")
    assert recipe_precision({}) == "fp32"


def test_an_emulated_precision_is_refused_unless_allowed(flags):
    flags(AVX2 | cap.AVX512_CORE)  # AVX-512 without bf16 units: bf16 runs, emulated
    cfg = load_preset("tiny", ["train.system.precision=bf16"])
    with pytest.raises(ConfigError, match=r"train.system.precision=bf16 is emulated on this CPU .*27x slower.*"
                                          r"--allow-emulated"):
        check_precision(cfg, CPU, allow_emulated=False)
    assert check_precision(cfg, CPU, allow_emulated=True).startswith("emulated: no native bf16")
    assert check_precision(tiny(), CPU, allow_emulated=False) is None  # auto: its choice takes native ones only


def test_train_refuses_an_emulated_precision_with_exit_2(flags, tiny_features, tmp_path, capsys):
    flags(AVX2 | cap.AVX512_CORE)
    assert main(["train", "--preset", "tiny", "--data", str(tiny_features), "--out", str(tmp_path / "r"),
                 "train.system.precision=bf16"]) == 2
    assert "emulated on this CPU" in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_auto_continuing_a_run_means_its_recorded_precision():
    here = tiny().to_dict()
    assert _as_recorded(here, {"train": {"system": {"precision": "bf16"}}})["train"]["system"]["precision"] == "bf16"
    fixed = load_preset("tiny").to_dict()
    assert _as_recorded(fixed, {"train": {"system": {"precision": "bf16"}}}) is fixed


def test_a_run_records_its_choice_and_a_resumed_run_keeps_it(flags, timer, tiny_features, tmp_path, monkeypatch):
    flags(BF16)
    monkeypatch.setenv("SPEECHPERF_CACHE", str(tmp_path / "cache"))  # this test's own choices
    timer(fp32=0.2, bf16=0.3)  # fp32 wins: the run trains in a precision every CPU runs
    run, real, args = tmp_path / "run", loop._evaluate, ["threads=1", "max_epochs=1", "train.eval.final_splits=none",
                                                         "train.system.precision=auto", "train.eval.decoder=greedy"]

    def signalled(model, t, split, beam, **kw):
        os.kill(os.getpid(), signal.SIGTERM)  # stops the run at its first evaluation, saved
        return real(model, t, split, beam, **kw)

    monkeypatch.setattr(loop, "_evaluate", signalled)
    with pytest.raises(Interrupted):
        loop.train(TrainRequest("tiny", tiny_features, run, args, quiet=True))
    with RunView.open(run) as r:
        assert r.config["train"]["system"]["precision"] == "fp32"
        choice = r.env["precision_choice"]
        assert choice["chosen"] == "fp32" and choice["candidates"] == {"fp32": 0.2, "bf16": 0.3}
        assert choice["shape"] == list(ap.data_shape(tiny(), tiny_features))  # the run's own median batch
    monkeypatch.setattr(loop, "_evaluate", real)
    timer(fp32=0.9, bf16=0.1)  # a new choice would be bf16: the resumed run keeps fp32, measuring nothing
    summary = loop.train(TrainRequest("tiny", tiny_features, run, args, quiet=True))
    assert summary["status"] in ("success", "max_epochs") and len(timer.calls) == 1
    assert summary["precision_choice"] == choice
    with RunView.open(run) as r:
        assert r.config["train"]["system"]["precision"] == "fp32"


def test_the_shape_timed_is_the_runs_median_planned_batch(tiny_features):
    """Of epoch 2's planned batches of the run's training splits, the one of median padded frames."""
    from speechperf.data.check import train_splits_of
    from speechperf.data.loader import load_index
    from speechperf.data.plan import plan_epoch
    cfg = tiny()
    utterances, frames = ap.data_shape(cfg, tiny_features)
    index = load_index(tiny_features, train_splits_of(tiny_features))
    batches = plan_epoch(index, cfg.loader, epoch=2, seed=cfg.train.seed).batches
    sizes = sorted(len(b) * int(index.frames[b].max()) for b in batches)
    assert utterances * frames == sizes[len(sizes) // 2] and len(sizes) > 4
    assert any(len(b) == utterances and int(index.frames[b].max()) == frames for b in batches)
    assert (utterances, frames) != ap.typical_shape(cfg)  # the test corpus's batch, not the typical 6 s one


CONFORMER = ["model.name=conformer", "model.d_model=16", "model.layers=1", "model.heads=2", "model.conv_kernel=3",
             "model.subsampling_channels=4"]


def test_fp8_is_a_candidate_only_on_a_gpu_with_fp8_tensor_cores(flags, monkeypatch):
    cfg = tiny(*CONFORMER)
    monkeypatch.setattr(cap, "cuda_capability", lambda device: (9, 0))  # H100
    native, _ = ap.candidates(cfg, torch.device("cuda:0"))
    assert native == ["fp32", "bf16", "fp16", "fp8"]
    monkeypatch.setattr(cap, "cuda_capability", lambda device: (8, 0))  # A100
    native, others = ap.candidates(cfg, torch.device("cuda:0"))
    assert native == ["fp32", "bf16", "fp16"] and others["fp8"].startswith("unsupported on this GPU: no FP8 tensor")
    flags(BF16)  # a CPU with native bf16: fp8 is emulated there, no candidate
    native, others = ap.candidates(cfg, CPU)
    assert native == ["fp32", "bf16"] and others["fp8"].startswith("emulated: no FP8 tensor cores on a CPU")


def test_an_fp8_candidate_is_timed_with_its_layers_swapped():
    from speechperf.models import fp8

    cfg = tiny(*CONFORMER)
    assert fp8.swapped(ap._kit(cfg, CPU, "fp8")[0]) == 9 and fp8.swapped(ap._kit(cfg, CPU, "bf16")[0]) == 0
    times = ap.time_candidates(cfg, CPU, ["bf16", "fp8"], (2, 60), steps=1)
    assert set(times) == {"bf16", "fp8"} and all(t > 0 for t in times.values())


def test_fp8_on_a_gpu_without_fp8_tensor_cores_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(cap, "cuda_capability", lambda device: (8, 0))  # A100
    with pytest.raises(ConfigError) as e:
        check_precision(tiny(*CONFORMER, "train.system.precision=fp8"), torch.device("cuda:0"))
    assert str(e.value) == ("train.system.precision=fp8 cannot train model conformer here: unsupported on this GPU: no FP8 "
                            "tensor cores on this GPU (compute capability 8.0; 8.9 or newer has them); use "
                            "train.system.precision=fp32")
    monkeypatch.setattr(cap, "cuda_capability", lambda device: (9, 0))  # H100: native, its swap in the run's note
    assert check_precision(tiny(*CONFORMER, "train.system.precision=fp8"), torch.device("cuda:0")).startswith(
        "9 of 10 Linear layers in float8")
