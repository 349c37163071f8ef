import time
from types import SimpleNamespace

import pytest

from speechperf.telemetry.power import PowerMeter, energy_of, gpu_util, top_level
from speechperf.telemetry.sample import Sample
from speechperf.telemetry.sampler import Sampler, SamplerConfig


def test_counter_energy_sums_packages_not_their_subzones():
    summary = {"energy_j": {"rapl:intel-rapl:0": 30.0, "rapl:intel-rapl:0:0": 20.0, "rapl:intel-rapl:1": 10.0},
               "energy_method": {"rapl:intel-rapl:0": "counter", "rapl:intel-rapl:1": "counter"},
               "unavailable": {"gpu": "NVML unavailable"}}
    e = energy_of(summary, seconds=2.0)
    assert e["energy_j"] == 40.0 and e["power_w"] == 20.0
    assert e["energy"] == "rapl:intel-rapl:0: counter, rapl:intel-rapl:1: counter"
    assert top_level("gpu0") and top_level("rapl:intel-rapl:0") and not top_level("rapl:intel-rapl:0:1")


def test_no_source_says_why():
    e = energy_of({"energy_j": {}, "energy_method": {}, "unavailable": {"rapl": "no RAPL zones"}}, 1.0)
    assert e["power_w"] is None and e["energy_j"] is None and e["energy"] == "unavailable: rapl: no RAPL zones"


class FakeSampler:
    """Two GPU power readings 1 s apart (100 W then 300 W): 200 J by the trapezoid rule."""

    def __init__(self):
        self.samples = []

    def start(self):
        self.samples = [Sample(0.0, "gpu0", "power_w", 100.0), Sample(1.0, "gpu0", "power_w", 300.0)]

    def stop(self):
        pass

    def summary(self):
        return {"energy_j": {"gpu0": 200.0}, "energy_method": {"gpu0": "integrated-power"}, "unavailable": {}}


def test_power_meter_joules_per_sample():
    with PowerMeter(sampler=FakeSampler(), min_seconds=0.0) as m:
        pass
    r = m.result(samples=50)
    assert r["joules_per_sample"] == pytest.approx(4.0) and r["energy"] == "gpu0: integrated-power"
    assert r["gpu_util_pct"] is None  # no GPU reported a utilization
    assert m.seconds >= 0 and r["power_w"] == pytest.approx(200.0 / m.seconds)


class SteppingNVML:
    """One GPU at 200 W whose energy counter steps every 100 ms (as NVML's), no instant field."""

    def __init__(self):
        self.born = time.time()

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=0)

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=100)

    def nvmlDeviceGetPowerUsage(self, h):
        return 200_000

    def nvmlDeviceGetFieldValues(self, h, fields):
        steps = int((time.time() - self.born) / 0.1)
        energy = SimpleNamespace(nvmlReturn=0, valueType=3, value=SimpleNamespace(ullVal=steps * 20_000))  # mJ
        return [energy if f == 83 else SimpleNamespace(nvmlReturn=3, valueType=1, value=None) for f in fields]


def _meter(min_seconds, seconds):
    sampler = Sampler(config=SamplerConfig(rapl=False), nvml=SteppingNVML())
    with PowerMeter(sampler=sampler, min_seconds=min_seconds) as m:
        time.sleep(seconds)
    return m.result(samples=10)


def test_a_window_shorter_than_the_counter_can_measure_is_marked_never_zero_watts():
    short = _meter(0.5, 0.05)
    assert short["power_w"] is None and short["energy_j"] is None and short["joules_per_sample"] is None
    assert short["energy"].startswith("window too short for the energy counter (0.0")
    still = _meter(0.0, 0.05)  # allowed, but the counter did not step inside it
    assert still["power_w"] is None and "gpu0: no energy counted" in still["energy"]
    long = _meter(0.5, 1.0)
    assert long["power_w"] == pytest.approx(200.0, rel=0.2) and long["energy"] == "gpu0: counter"
    assert long["gpu_util_pct"] == 100.0  # the fake driver's utilization, every sample
    assert long["joules_per_sample"] == pytest.approx(long["energy_j"] / 10)


def test_energy_of_leaves_out_a_source_that_did_not_count():
    summary = {"energy_j": {"gpu0": 0.0, "gpu1": 50.0}, "energy_method": {"gpu0": "counter", "gpu1": "counter"}}
    e = energy_of(summary, 2.0, min_seconds=2.0)
    assert e["energy_j"] == 50.0 and e["power_w"] == 25.0 and "gpu0: no energy counted, left out" in e["energy"]


def test_gpu_util_is_the_mean_over_the_gpus_that_reported_one():
    summary = {"gpus": {"gpu0": {"util_mean": 90.0}, "gpu1": {"util_mean": 70.0}, "gpu2": {"util_mean": None}}}
    assert gpu_util(summary) == 80.0 and gpu_util({"gpus": {}}) is None and gpu_util({}) is None
