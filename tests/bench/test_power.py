import pytest

from speechperf.bench.power import PowerMeter, energy_of, top_level
from speechperf.telemetry.sampler import Sample


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
    with PowerMeter(sampler=FakeSampler()) as m:
        pass
    r = m.result(samples=50)
    assert r["joules_per_sample"] == pytest.approx(4.0) and r["energy"] == "gpu0: integrated-power"
    assert m.seconds >= 0 and r["power_w"] == pytest.approx(200.0 / m.seconds)
