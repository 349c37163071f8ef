import json
import os
from pathlib import Path
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import psutil
import pytest

from speechperf.hardware.environment import capture_env
from speechperf.telemetry.device_gpus import RunGpu
from speechperf.telemetry.sample import Sample
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
        idle = [x.value for x in s.samples if x.metric == "util_core_pct"]
        c0 = time.process_time()
        t = threading.Thread(target=burn, args=(1.0,))
        t.start()
        t.join()
        burnt = time.process_time() - c0
    core = [x.value for x in s.samples if x.metric == "util_core_pct"]
    machine = [x.value for x in s.samples if x.metric == "util_machine_pct"]
    busy = core[len(idle):]
    assert len(idle) >= 5 and len(busy) >= 10  # ~0.03 s period
    # a busy thread is up to 100% of one core: what it gets of a loaded machine, as the process's own clock says
    assert sorted(busy)[len(busy) // 2] > sorted(idle)[len(idle) // 2] + 10
    times = [x.t for x in s.samples if x.metric == "util_core_pct"]
    in_busy = sum(v / 100 * (b - a) for v, a, b in zip(busy, times[len(idle) - 1:], times[len(idle):]))
    assert in_busy == pytest.approx(burnt, rel=0.15, abs=0.03)
    assert machine == pytest.approx([c / s.cores for c in core])  # the same samples, two units
    summary = s.summary()
    assert 0 < summary["cpu_util_core_pct_mean"] < 100 * s.cores
    assert summary["cpu_util_machine_pct_mean"] == pytest.approx(summary["cpu_util_core_pct_mean"] / s.cores)
    assert summary["sampler_cpu_s"] < 0.5  # its own cost over ~1.5 s
    cpu = summary["periods"]["cpu:util_machine_pct"]
    assert cpu["asked_s"] == 0.03 and 0.025 < cpu["median_s"] < 0.06 and cpu["count"] == len(machine)


BUSY = "import time\nwhile True: pass"


def test_restarting_loader_workers_never_exceed_the_machine_and_keep_their_cpu_time():
    """Two busy 'loader workers' restart every 0.6 s 'epoch': each new worker's CPU time
    before the sampler found it goes into the samples since it started, not into one; each
    killed worker keeps what it used. Reference: psutil's CPU times of every process."""
    me = psutil.Process()
    s = Sampler(config=SamplerConfig(gpus=False, rapl=False, children_interval=0.2))
    epochs, used = 4, 0.0
    with s:
        c0 = me.cpu_times()
        for _ in range(epochs):
            workers = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2)]
            time.sleep(0.6)
            for w in workers:
                c = psutil.Process(w.pid).cpu_times()
                used += c.user + c.system
                w.kill()
                w.wait()
        c1 = me.cpu_times()
    used += (c1.user + c1.system) - (c0.user + c0.system)
    machine = [x.value for x in s.samples if x.metric == "util_machine_pct"]
    assert max(machine) <= 100.0 + 1e-6, max(machine)
    assert max(x.value for x in s.samples if x.metric == "util_core_pct") <= 100.0 * s.cores + 1e-6
    summary = s.summary()
    # a killed worker loses at most its last period (0.03 s of one core) since the last read
    assert summary["cpu_seconds"] == pytest.approx(used, abs=0.05 * used + 2 * epochs * 0.03)
    core = [x for x in s.samples if x.metric == "util_core_pct"]
    in_samples = sum(b.value / 100 * (b.t - a.t) for a, b in zip([Sample(0.0, "", "", 0.0)] + core, core))
    assert in_samples == pytest.approx(summary["cpu_seconds"] - summary["cpu_seconds_unplaced"], rel=0.1)


def test_flush_makes_every_sample_so_far_final_with_a_new_child_s_cpu_time_in_them():
    """Issue 48: a checkpoint stores the samples up to its moment (Sampler.flush), not those that
    ``settled`` gives (up to 1-2 s before it: a child found by a later scan may still add to them)."""
    s = Sampler(config=SamplerConfig(gpus=False, rapl=False, children_interval=30.0))  # no scan but the flush's
    with s:
        time.sleep(0.2)  # the sampler's first scan is behind it: the worker below is new to it
        worker = subprocess.Popen([sys.executable, "-c", BUSY])
        time.sleep(1.0)
        at = time.perf_counter() - s._t0
        assert s.settled() < len(s.samples)  # what a checkpoint stored before
        n = s.flush()
        kept = list(s.samples[:n])
        c = psutil.Process(worker.pid).cpu_times()
        time.sleep(0.3)
        worker.kill()
        worker.wait()
    assert kept[-1].t >= at - 0.05  # up to the flush
    assert s.samples[:n] == kept  # final: the samples after it changed nothing in them
    core = [x for x in kept if x.metric == "util_core_pct"]
    in_samples = sum(b.value / 100 * (b.t - a.t) for a, b in zip([Sample(0.0, "", "", 0.0)] + core, core))
    assert in_samples >= 0.7 * (c.user + c.system)  # the worker's CPU time placed before the flush returned


def test_cpu_reader_counts_a_new_process_from_when_it_is_found():
    from speechperf.telemetry.cpu_clock import CpuReader

    w = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        time.sleep(0.3)
        r = CpuReader(os.getpid())
        start = r.seconds()
        found = r.follow([w.pid])
        assert found[0][0] == w.pid and found[0][1] > 0.05  # what it used before: returned, not counted
        assert r.seconds() - start < 0.05
        time.sleep(0.2)
        during = r.seconds() - start
        assert during > 0.02
    finally:
        w.kill()
        w.wait()
    assert r.seconds() - start >= during  # exited: keeps what it used
    assert w.pid not in r.readers
    r.close()


class NVMLError(Exception):
    def __init__(self, code):
        super().__init__(f"NVMLError {code}")
        self.value = code


def _value(v, kind=1):
    return SimpleNamespace(nvmlReturn=0, valueType=kind, value=SimpleNamespace(uiVal=v, ullVal=v, dVal=float(v)))


class FakeNVML:
    """Two GPUs and a driver that keeps buffered samples.

    gpu0: instant power field (150 W) and energy counter (fields, one call), buffered
    utilization samples every 20 ms (driver timestamps, us). gpu1: neither field, no energy
    counter, no buffered utilization (polled: 60%), buffered power samples every 100 ms (90 W).
    ``calls`` counts calls per (function, handle).
    """

    NVML_FI_DEV_POWER_INSTANT = 186

    def __init__(self):
        self.calls = {}
        self.born = time.time()

    def _count(self, name, h):
        self.calls[(name, h)] = self.calls.get((name, h), 0) + 1

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUtilizationRates(self, h):
        self._count("util", h)
        return SimpleNamespace(gpu=50 + 10 * h)

    def nvmlDeviceGetMemoryInfo(self, h):
        self._count("mem", h)
        return SimpleNamespace(used=2**30)

    def nvmlDeviceGetFieldValues(self, h, fields):
        self._count("fields", h)
        if h == 1:
            return [SimpleNamespace(nvmlReturn=3, valueType=1, value=None) for _ in fields]  # not supported
        energy = int((time.time() - self.born) * 150_000) + 1_000_000  # mJ since "driver load", 150 W
        return [_value(150_000) if f == 186 else _value(energy, 3) for f in fields]

    def nvmlDeviceGetPowerUsage(self, h):
        self._count("power", h)
        return 90_000  # mW, averaged

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self._count("energy", h)
        raise NVMLError(3)

    def nvmlDeviceGetSamples(self, h, kind, since_us):
        self._count(f"samples{kind}", h)
        if (h, kind) not in ((0, 1), (1, 0)):
            raise NVMLError(3)  # not supported
        period = 0.02 if kind == 1 else 0.1
        n = int((time.time() - self.born) / period)
        stamps = [int((self.born + k * period) * 1e6) for k in range(n + 1)]
        new = [t for t in stamps if t > since_us]
        if not new:
            raise NVMLError(6)  # not found: nothing newer
        return (1, [SimpleNamespace(timeStamp=t, sampleValue=SimpleNamespace(uiVal=70 if kind == 1 else 90_000))
                    for t in new])


def test_nvml_period_and_buffered_samples_against_a_fake_driver():
    nv = FakeNVML()
    time.sleep(0.1)  # the driver's buffer holds samples from before the sampler started
    s = Sampler(config=SamplerConfig(rapl=False, gpu_buffer_interval=0.25), nvml=nv)
    with s:
        time.sleep(1.0)
    summary = s.summary()
    periods = summary["periods"]
    power = periods["gpu0:power_w"]
    # deadlines, not "now + period" after a 30 ms CPU tick: the 50 ms period holds
    assert power["asked_s"] == 0.05 and 0.045 < power["median_s"] < 0.058 and 15 <= power["count"] <= 22
    ticks = power["count"]
    assert nv.calls[("fields", 0)] == ticks  # one NVML call per GPU per tick: power and energy together
    assert ("util", 0) not in nv.calls and ("power", 0) not in nv.calls
    util = [x for x in s.samples if (x.source, x.metric) == ("gpu0", "util_pct")]
    ts = [x.t for x in util]
    assert ts == sorted(ts) and len(set(ts)) == len(ts) and 0 <= ts[0] and ts[-1] <= 1.2  # driver times, each once
    assert periods["gpu0:util_pct"]["asked_s"] is None and periods["gpu0:util_pct"]["median_s"] == pytest.approx(0.02, abs=1e-3)
    assert 40 <= len(util) <= 60 and {x.value for x in util} == {70.0}
    assert summary["gpus"]["gpu0"] == {"util_mean": 70.0, "mem_mb_max": 1024.0, "power_field": "instant",
                                       "util_field": "buffered"}
    assert summary["gpus"]["gpu1"] == {"util_mean": 60.0, "mem_mb_max": 1024.0, "power_field": "buffered",
                                       "util_field": "polled"}
    assert summary["power_w"]["gpu0"] == 150.0 and summary["power_w"]["gpu1"] == 90.0
    assert periods["gpu1:power_avg_w"]["median_s"] == pytest.approx(0.1, abs=1e-3)
    assert summary["energy_method"] == {"gpu0": "counter", "gpu1": "integrated-power"}
    assert summary["energy_j"]["gpu0"] == pytest.approx(150.0 * 1.0, rel=0.2)
    assert "gpu1:energy" in summary["unavailable"]
    assert nv.calls[("energy", 1)] == 1  # tried once when the field was missing, then left alone


def test_sampler_follows_the_gpus_it_is_given():
    s = Sampler(config=SamplerConfig(rapl=False), nvml=FakeNVML(), gpus=[1])
    with s:
        time.sleep(0.15)
    assert {x.source for x in s.samples} == {"cpu", "gpu1"}
    bad = Sampler(config=SamplerConfig(rapl=False), nvml=FakeNVML(), gpus=[2])
    assert "asked for index(es) [2]" in bad.unavailable["gpu"]


class UuidNVML(FakeNVML):
    """FakeNVML whose GPUs have UUIDs as NVML gives them (gpu1's as bytes, an old pynvml's)."""

    def nvmlDeviceGetUUID(self, h):
        return ["GPU-AAAA-0", b"GPU-bbbb-1"][h]


def test_the_run_s_gpus_are_picked_by_uuid_and_an_unmatched_one_is_said():
    """A seed given GPU 1 (CUDA_VISIBLE_DEVICES=1) is cuda:0 to torch, NVML's 1: its UUID, as torch
    prints it (no prefix), picks NVML's gpu1 alone, not every GPU of the node."""
    s = Sampler(config=SamplerConfig(rapl=False), nvml=UuidNVML(), run_gpus=[RunGpu("bbbb-1", None)])
    with s:
        time.sleep(0.15)
    assert {x.source for x in s.samples} == {"cpu", "gpu1"} and "gpu_selection" not in s.unavailable
    both = Sampler(config=SamplerConfig(rapl=False), nvml=UuidNVML(), run_gpus=[RunGpu("aaaa-0", None), RunGpu("BBBB-1", None)])
    assert [g.source for g in both._gpus] == ["gpu0", "gpu1"]
    lost = Sampler(config=SamplerConfig(rapl=False), nvml=UuidNVML(), run_gpus=[RunGpu("cccc-2", None)])
    assert [g.source for g in lost._gpus] == ["gpu0", "gpu1"]  # every GPU, never none
    assert lost.unavailable["gpu_selection"] == ("every GPU sampled: the run's GPU(s) cccc-2 not all among NVML's "
                                                 "(aaaa-0, bbbb-1)")
    old = Sampler(config=SamplerConfig(rapl=False), nvml=FakeNVML(), run_gpus=[RunGpu("aaaa-0", None)])  # no nvmlDeviceGetUUID
    assert len(old._gpus) == 2 and old.unavailable["gpu_selection"].startswith("every GPU sampled: NVML gave no UUID")
    blind = Sampler(config=SamplerConfig(rapl=False), nvml=UuidNVML(), run_gpus=[RunGpu(None, "0000:c1:00")])
    assert len(blind._gpus) == 2
    assert blind.unavailable["gpu_selection"] == "every GPU sampled: torch gave no UUID for the run's GPU(s)"


def test_real_nvml_holds_the_period():
    """The real driver's path: skipped where NVML or a GPU is missing."""
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() == 0:
            pytest.skip("NVML found no GPU")
    except pynvml.NVMLError as e:
        pytest.skip(f"NVML unavailable: {e}")
    s = Sampler(config=SamplerConfig(rapl=False), gpus=[0])
    with s:
        time.sleep(2.0)
    periods = s.summary()["periods"]
    power = periods.get("gpu0:power_w") or periods["gpu0:power_avg_w"]
    assert power["count"] >= 10
    if power["asked_s"]:
        assert power["median_s"] < 1.2 * power["asked_s"]
    assert periods["gpu0:util_pct"]["count"] >= 2 and s.summary()["gpus"]["gpu0"]["mem_mb_max"] > 0


def test_no_nvml_and_unreadable_rapl_are_recorded(tmp_path):
    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (zone / "energy_uj").write_text("not a number")
    fails = SimpleNamespace(nvmlInit=lambda: (_ for _ in ()).throw(OSError("no driver")))
    s = Sampler(config=SamplerConfig(), nvml=fails, amdsmi=SimpleNamespace(), rapl_root=tmp_path)
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
        # replaced whole, as sysfs reads are: write_text truncates first, and a read between the
        # truncation and the write saw an empty file (the zone then dropped as unreadable: a loaded
        # machine's flake that counted 1000 J)
        (pkg / "energy_uj.new").write_text(raw)
        os.replace(pkg / "energy_uj.new", pkg / "energy_uj")
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
    assert set(env["telemetry"]) == {"gpus", "gpu_library", "rapl_zones", "unavailable"}
    got = availability(nvml=FakeNVML(), rapl_root=Path("/nonexistent"))
    assert got["gpus"] == 2 and got["gpu_library"] == "NVML"


def test_environment_is_recorded():
    env = capture_env("cpu")
    json.dumps(env)
    assert env["cpu_cores_logical"] >= 1 and env["libraries"]["torch"]
    import torch  # a GPU machine records its GPUs, this one none

    assert len(env["gpus"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)


def test_a_gpu_that_stops_answering_is_dropped_with_the_reason_and_cpu_sampling_goes_on():
    class Lost(FakeNVML):
        def nvmlDeviceGetFieldValues(self, h, fields):
            if h == 0 and time.time() - self.born > 0.2:
                raise NVMLError(15)  # GPU is lost
            return super().nvmlDeviceGetFieldValues(h, fields)

    s = Sampler(config=SamplerConfig(rapl=False), nvml=Lost())
    with s:
        time.sleep(0.6)
    assert "GPU is lost" not in s.unavailable.get("gpu1", "") and "NVML stopped answering" in s.unavailable["gpu0"]
    last_gpu0 = max(x.t for x in s.samples if x.source == "gpu0" and x.metric == "power_w")
    assert last_gpu0 < 0.35 and max(x.t for x in s.samples if x.source == "cpu") > 0.5
    assert max(x.t for x in s.samples if x.source == "gpu1") > 0.5


def test_the_others_share_leaves_out_the_run_and_the_children_a_scan_found(monkeypatch):
    """Each scan: the machine's busy CPU seconds since the previous one less the run's, children found
    by this scan counted with what they used before it (they started after the previous scan)."""
    from speechperf.telemetry import sampler as sampler_module

    machine = iter([100.0, 101.5, 103.0])  # busy CPU seconds since boot at three scans
    monkeypatch.setattr(sampler_module, "_machine_busy_s", lambda: next(machine))
    s = Sampler(config=SamplerConfig(gpus=False, rapl=False))
    s.cores, s._t0 = 2, 10.0
    reader = SimpleNamespace(value=0.0, seconds=lambda: reader.value)
    s._others_sample(reader, 0.0, first=True, t=10.0)  # starts the count
    reader.value = 0.5
    s._others_sample(reader, 0.0, first=False, t=11.0)  # 1.5 s busy, 0.5 s the run's: 1 s of 2 CPUs
    reader.value = 0.7
    s._others_sample(reader, 0.8, first=False, t=12.0)  # a child found, 0.8 s before: 1.5 - 0.2 - 0.8
    assert [(x.t, x.source, x.metric, x.value) for x in s.samples] == [(1.0, "cpu", "others_pct", 50.0),
                                                                      (2.0, "cpu", "others_pct", 25.0)]


def test_a_busy_process_outside_the_run_is_an_others_share():
    """The run followed alone (no children): a busy subprocess is another process on the machine."""
    p = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        s = Sampler(config=SamplerConfig(gpus=False, rapl=False, include_children=False, children_interval=0.2))
        with s:
            time.sleep(1.5)
    finally:
        p.kill()
        p.wait()
    others = [x.value for x in s.samples if x.metric == "others_pct"]
    assert len(others) >= 5 and all(0 <= v <= 100 for v in others)
    # the spinner holds most of a core (what a loaded machine gives it): at least a quarter of it on average
    assert sum(others) / len(others) >= 25.0 / s.cores
