"""``bench scale`` end to end at a tiny size: batches planned by duration, throughput, MFU, the
measured peak beside the estimate; the refusals."""
from __future__ import annotations

import json

from types import SimpleNamespace

import pytest

from speechperf.bench import scale
from speechperf.cli import main
from speechperf.hardware import measured_peak
from speechperf.telemetry.power import PowerMeter
from speechperf.telemetry.sampler import Sampler, SamplerConfig
from tests.telemetry.test_power import SteppingNVML

TINY = ["model.d_model=32", "model.layers=1", "model.heads=2", "model.subsampling_channels=8"]


@pytest.fixture
def known_peak(monkeypatch, tmp_path):
    monkeypatch.setenv("SPEECHPERF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(measured_peak, "measure_gemm", lambda threads, dtype="fp32": {
        "tflops": 0.1, "n": 1024, "threads": threads, "dtype": dtype, "at": "now", "others_busy_pct": 0.0,
        "library": "torch.mm"})


def test_bench_scale_measures_a_tiny_workload_end_to_end(known_peak, capsys):
    assert main(["bench", "scale", "--workloads", "fastconformer-l", "--batch-seconds", "40", "--steps", "1",
                 "--warmup", "0", "--json", *TINY]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["status"] == "ok" and row["batch_s"] == 40 and row["utterances"] >= 2
    assert row["padded_s"] <= 40 and row["audio_s_per_s"] > 0 and row["utt_per_s"] > 0 and row["mfu_pct"] > 0
    # at 1 block of width 32 what no rule counts weighs more than at scale (tests/hardware/test_memory.py: 15%)
    assert 0.75 < row["estimate_ratio"] < 1.25 and row["peak_gb"] > 0
    assert row["power_w"] is None or row["wh_per_audio_h"] > 0
    # the one timed step's own rate: its audio over its seconds, so min = median = max = the row's rate
    assert row["audio_s_per_s_min"] == row["audio_s_per_s_median"] == row["audio_s_per_s_max"]
    assert row["audio_s_per_s_median"] == pytest.approx(row["audio_s_per_s"], rel=1e-9)
    assert row["gpu_busy_pct"] is None or 0 <= row["gpu_busy_pct"] <= 100  # None without a GPU


class BusyNVML(SteppingNVML):
    """One GPU whose driver says 87% busy."""

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=87)


def test_the_gpus_busy_share_over_the_timed_steps_is_in_the_row_and_its_notes(known_peak, monkeypatch):
    sampler = lambda: Sampler(config=SamplerConfig(rapl=False, gpu_interval=0.001), nvml=BusyNVML())  # noqa: E731
    monkeypatch.setattr(scale, "PowerMeter", lambda run_gpus: PowerMeter(sampler=sampler()))
    (row,) = scale.run_scale(scale.Request(("fastconformer-l",), (40,), steps=1, warmup=0, measure_memory=False,
                                           overrides=tuple(TINY)), progress=False)
    assert row["gpu_busy_pct"] == 87.0
    assert ("GPU busy over the timed steps (the driver's utilization): fastconformer-l fp32 x1: 87 %"
            in scale.notes([row]))


def test_fp8_rows_say_emulation_and_a_gpu_without_it_is_refused(known_peak, monkeypatch):
    from speechperf.hardware import capability

    (row,) = scale.run_scale(scale.Request(("fastconformer-l",), (40,), steps=2, warmup=0, precision="fp8",
                                           measure_memory=False, overrides=tuple(TINY)), progress=False)
    assert row["status"] == "ok" and row["precision"] == "fp8"
    assert row["audio_s_per_s_min"] <= row["audio_s_per_s_median"] <= row["audio_s_per_s_max"]
    assert "fastconformer-l: fp8 on cpu is torchao's emulation: its rates are not fp8's" in scale.notes([row])
    monkeypatch.setattr(capability, "cuda_capability", lambda device: (8, 0))
    with pytest.raises(scale.SpeechperfError, match="bench scale --precision fp8: fastconformer-l: unsupported on this "
                                                    "GPU: no FP8 tensor cores"):
        scale._config(scale.Request(precision="fp8"), "fastconformer-l", None, scale.torch.device("cuda:0"))


def test_batches_are_the_planners_cut_by_seconds_of_audio():
    from speechperf.config import load_preset

    cfg = load_preset("fastconformer-l", ["loader.max_duration=60"])
    batches = scale.planned_batches(cfg, 4, seed=0)
    assert all(len(f) * int(f.max()) * 0.01 <= 60 and s.max() <= scale.LONGEST_S for f, s in batches)
    assert len({len(f) for f, _ in batches}) > 1 or len(batches[0][0]) > 2  # several utterances a batch


def test_a_world_that_is_not_torchruns_and_a_run_that_cannot_fit_are_refused(known_peak):
    from speechperf.errors import SpeechperfError
    from speechperf.hardware.memory import DoesNotFit

    with pytest.raises(SpeechperfError, match=r"--world=2 but this process is one of 1 \(torchrun's WORLD_SIZE\)"):
        scale.run_scale(scale.Request(world=2), progress=False)  # N ranks: torchrun's (bench/scale_launch.py)
    req = scale.Request(workloads=("fastconformer-xl",), batch_seconds=(30.0,), memory_limit_gb=8.0)
    with pytest.raises(DoesNotFit, match=r"fastconformer-xl at 30 s: the run needs 1\d\.\d GB per device"):
        scale.run_scale(req, progress=False)


def test_steps_that_beat_the_cached_cpu_peak_drop_it(known_peak, monkeypatch):
    import torch

    peak = measured_peak.cpu_gemm_peak(torch.get_num_threads())  # 0.1 TFLOPS, now cached
    got = scale._mfu(1e12, 1.0, peak, dev=torch.device("cpu"))  # 1 TFLOPS achieved: the peak was low
    assert got["mfu_pct"] is None and "its cached entry is dropped" in got["peak_source"]
    assert not measured_peak.forget(torch.get_num_threads())  # already gone: the next row measures it
    assert scale._mfu(1e10, 1.0, peak, world=2)["mfu_pct"] == pytest.approx(5.0)  # 0.01 of 2 x 0.1


def test_compile_is_honoured_as_the_loop_does_and_cuda_graphs_are_refused_by_the_config(known_peak, monkeypatch):
    seen = []
    monkeypatch.setattr(scale, "compiled", lambda model: seen.append(type(model).__name__) or model)
    req = scale.Request(("fastconformer-l",), (40,), steps=1, warmup=0, measure_memory=False,
                        overrides=(*TINY, "train.system.compile=true"))
    (row,) = scale.run_scale(req, progress=False)
    assert row["status"] == "ok" and seen == ["FastConformer"]
    with pytest.raises(scale.SpeechperfError, match="cuda_graphs=true needs model ds2 .*, not model 'fastconformer'"):
        scale._config(scale.Request(overrides=("train.system.cuda_graphs=true",)), "fastconformer-l", None,
                      scale.torch.device("cpu"))
