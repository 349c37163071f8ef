import json
from pathlib import Path
import threading
import time
from types import SimpleNamespace

import pytest

from speechperf.telemetry.environment import capture_env
from speechperf.telemetry.sampler import Sampler, SamplerConfig


def burn(seconds):
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def test_cpu_utilization_of_this_process_rises_under_load():
    s = Sampler(config=SamplerConfig(gpus=False, rapl=False))
    with s:
        time.sleep(0.5)
        idle = [x.value for x in s.samples if x.metric == "util_pct"]
        t = threading.Thread(target=burn, args=(1.0,))
        t.start()
        t.join()
    busy = [x.value for x in s.samples if x.metric == "util_pct"][len(idle):]
    assert len(idle) >= 5 and len(busy) >= 10  # ~0.03 s period
    # a busy thread is ~100% of one core; 40 leaves room for a loaded 2-core machine
    assert sorted(busy)[len(busy) // 2] > 40 > sorted(idle)[len(idle) // 2] + 20
    summary = s.summary()
    assert 0 < summary["cpu_util_mean"] < 250
    assert summary["sampler_cpu_s"] < 0.5  # its own cost over ~1.5 s


class FakeNVML:
    """Two GPUs; gpu0 has the instant power field and the energy counter, gpu1 neither."""

    NVML_FI_DEV_POWER_INSTANT = 186

    def __init__(self):
        self.energy = [1000.0, None]

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=50 + 10 * h)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=2**30)

    def nvmlDeviceGetFieldValues(self, h, fields):
        if h == 1:
            return [SimpleNamespace(nvmlReturn=3, value=None)]  # not supported
        return [SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(uiVal=150_000))]

    def nvmlDeviceGetPowerUsage(self, h):
        return 90_000  # mW, averaged

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        if self.energy[h] is None:
            raise RuntimeError("NVMLError_NotSupported")
        self.energy[h] += 7.5  # mJ per call
        return self.energy[h]


def test_nvml_path_against_a_fake_driver():
    s = Sampler(config=SamplerConfig(rapl=False, gpu_interval=0.01), nvml=FakeNVML())
    with s:
        time.sleep(0.3)
    by = {(x.source, x.metric) for x in s.samples}
    assert {("gpu0", "util_pct"), ("gpu0", "power_w"), ("gpu0", "energy_j"), ("gpu1", "power_avg_w")} <= by
    assert ("gpu1", "energy_j") not in by and ("gpu1", "power_w") not in by
    summary = s.summary()
    assert summary["power_w"]["gpu0"] == 150.0 and summary["power_w"]["gpu1"] == 90.0
    assert summary["energy_method"] == {"gpu0": "counter", "gpu1": "integrated-power"}
    assert summary["energy_j"]["gpu0"] > 0 and summary["energy_j"]["gpu1"] > 0
    assert "gpu1:energy" in summary["unavailable"]
    assert summary["gpus"]["gpu0"] == {"util_mean": 50.0, "mem_mb_max": 1024.0, "power_field": "instant"}
    assert summary["gpus"]["gpu1"]["power_field"] == "average"


def test_no_nvml_and_unreadable_rapl_are_recorded(tmp_path):
    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (zone / "energy_uj").write_text("not a number")
    s = Sampler(config=SamplerConfig(), nvml=SimpleNamespace(nvmlInit=lambda: (_ for _ in ()).throw(OSError("no driver"))),
                rapl_root=tmp_path)
    with s:
        time.sleep(0.05)
    un = s.summary()["unavailable"]
    assert "no driver" in un["gpu"] and "rapl:intel-rapl:0" in un
    assert Sampler(config=SamplerConfig(gpus=False), rapl_root=tmp_path / "none").unavailable["rapl"].startswith("no RAPL")


def _zone(root, name, label, uj, top="1000000000"):
    zone = root / name
    zone.mkdir()
    (zone / "name").write_text(label + "\n")
    (zone / "energy_uj").write_text(str(uj))
    if top is not None:
        (zone / "max_energy_range_uj").write_text(top)
    return zone


def test_rapl_counter_with_wraparound(tmp_path):
    pkg = _zone(tmp_path, "intel-rapl:0", "package-0", 999000000)
    _zone(tmp_path, "intel-rapl:0:1", "dram", 5)
    s = Sampler(config=SamplerConfig(gpus=False, rapl_interval=0.01), rapl_root=tmp_path).start()
    # two wraps, each seen by a periodic read: 1 J to the top + 2 J, then 998 J + 1 J more
    for raw in ("2000000", "999000000", "0"):
        (pkg / "energy_uj").write_text(raw)
        time.sleep(0.15)
    s.stop()
    summary = s.summary()
    assert summary["energy_j"]["rapl:intel-rapl:0"] == pytest.approx(1.0 + 2.0 + 997.0 + 1.0)
    assert summary["energy_j"]["rapl:intel-rapl:0:1"] == 0.0
    assert summary["energy_method"]["rapl:intel-rapl:0"] == "counter"
    assert summary["rapl_names"] == {"rapl:intel-rapl:0": "package-0", "rapl:intel-rapl:0:1": "dram"}
    pts = [x for x in s.samples if x.source == "rapl:intel-rapl:0"]
    assert pts[0].t == 0.0 and pts[0].value == 0.0 and len(pts) >= 4  # a time series, not one reading


def test_rapl_zone_without_wrap_limit_or_permission_is_unavailable(tmp_path, monkeypatch):
    from speechperf.telemetry import rapl

    _zone(tmp_path, "intel-rapl:0", "package-0", 10, top=None)
    _zone(tmp_path, "intel-rapl:1", "package-1", 10)
    real = rapl.RaplZone.read_raw

    def denied(self):
        if self.path.name == "intel-rapl:1":
            raise PermissionError(13, "Permission denied")
        return real(self)

    monkeypatch.setattr(rapl.RaplZone, "read_raw", denied)
    counters = rapl.RaplCounters(tmp_path)
    assert counters.zones == []
    assert "max_energy_range_uj" in counters.unavailable["rapl:intel-rapl:0"]
    assert "PermissionError" in counters.unavailable["rapl:intel-rapl:1"]


def test_availability_is_recorded_in_the_environment():
    from speechperf.telemetry.sampler import availability

    env = capture_env("cpu")
    assert set(env["telemetry"]) == {"gpus", "rapl_zones", "unavailable"}
    assert availability(nvml=FakeNVML(), rapl_root=Path("/nonexistent"))["gpus"] == 2


def test_environment_is_recorded():
    env = capture_env("cpu")
    json.dumps(env)
    assert env["cpu_cores_logical"] >= 1 and env["libraries"]["torch"] and env["gpus"] == []
