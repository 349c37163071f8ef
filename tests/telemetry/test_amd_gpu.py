"""The AMD reader (telemetry/amd_gpu.py) against a stand-in for amdsmi that follows its documented
functions and return shapes (amdsmi 7.0.2's amdsmi_interface.py: dicts of ints, "N/A" where the
firmware has no reading, an exception class with an error code): the cases of the NVML reader's
tests in test_sampler.py, plus "N/A" readings, the counter's wraparound and restart, and a
counter that disagrees with the power readings. No test here ran on AMD hardware; the last one
runs the real library where a ROCm machine has it."""
import time
from types import SimpleNamespace

import pytest

from speechperf.telemetry import amd_gpu
from speechperf.telemetry.amd_gpu import AmdGpu, open_amdsmi
from speechperf.telemetry.device_gpus import RunGpu
from speechperf.telemetry.sampler import Sampler, SamplerConfig, availability

RES = 15.3  # uJ per accumulator tick, as MI200/MI300 boards report it (ROCm/amdsmi issue 115)
NO_NVML = SimpleNamespace(nvmlInit=lambda: (_ for _ in ()).throw(OSError("libnvidia-ml.so.1: not found")))


class AmdSmiLibraryException(Exception):
    def __init__(self, code):
        super().__init__(f"Error code:\n\t{code} | AMDSMI_STATUS")
        self.err_code = code

    def get_error_code(self):
        return self.err_code


class FakeAMDSMI:
    """Two GPUs, listed by amdsmi in the order opposite to HIP's.

    HIP 0 (MI300X-like): instant power 500 W (average "N/A", as MI300X firmware gives it), an
    energy counter at 500 W that is 32 bits wide and starts 200 J below its wrap, gfx_activity
    80%. HIP 1: average power only (300 W), no energy counter (accumulator "N/A"), gfx_activity
    "N/A". ``calls`` counts calls per (function, handle); ``clock`` is the time the counters read.
    """

    AmdSmiInitFlags = SimpleNamespace(INIT_AMD_GPUS=2)
    AmdSmiLibraryException = AmdSmiLibraryException

    def __init__(self, clock=time.time):
        self.clock, self.born, self.calls = clock, clock(), {}
        self.inited = False

    def _count(self, name, h):
        self.calls[(name, h)] = self.calls.get((name, h), 0) + 1

    def amdsmi_init(self, flag=2):
        self.inited = True

    def amdsmi_get_processor_handles(self):
        assert self.inited, "amdsmi_init first"
        return ["hB", "hA"]

    def amdsmi_get_gpu_enumeration_info(self, h):
        return {"drm_render": 128, "drm_card": 0, "hsa_id": 2, "hip_id": {"hA": 0, "hB": 1}[h], "hip_uuid": "GPU-x"}

    def amdsmi_get_gpu_device_bdf(self, h):
        return {"hA": "0000:83:00.0", "hB": "0000:C1:00.0"}[h]

    def amdsmi_get_power_info(self, h):
        self._count("power", h)
        if h == "hA":
            return {"socket_power": 500, "current_socket_power": 500, "average_socket_power": "N/A",
                    "gfx_voltage": "N/A", "soc_voltage": "N/A", "mem_voltage": "N/A", "power_limit": 750}
        return {"socket_power": 300, "current_socket_power": "N/A", "average_socket_power": 300,
                "gfx_voltage": 900, "soc_voltage": 800, "mem_voltage": 1200, "power_limit": 560}

    def ticks(self, h):
        joules = 500.0 * (self.clock() - self.born) + (2 ** 32 * RES / 1e6 - 200.0)
        return int(joules / (RES / 1e6)) % 2 ** 32

    def amdsmi_get_energy_count(self, h):
        self._count("energy", h)
        ticks = self.ticks(h) if h == "hA" else "N/A"
        return {"energy_accumulator": ticks, "counter_resolution": RES, "timestamp": int(self.clock() * 1e9)}

    def amdsmi_get_gpu_activity(self, h):
        self._count("activity", h)
        return {"gfx_activity": 80 if h == "hA" else "N/A", "umc_activity": 30, "mm_activity": "N/A"}

    def amdsmi_get_gpu_vram_usage(self, h):
        self._count("vram", h)
        return {"vram_total": 196592, "vram_used": 1024}

    def amdsmi_get_gpu_asic_info(self, h):
        return {"market_name": "AMD Instinct MI300X", "vendor_id": "0x1002", "device_id": "0x74a1"}


def test_amd_power_energy_utilization_at_the_samplers_periods_against_a_stand_in():
    smi = FakeAMDSMI()
    s = Sampler(config=SamplerConfig(rapl=False, gpu_buffer_interval=0.25), nvml=NO_NVML, amdsmi=smi)
    with s:
        time.sleep(1.0)
    summary = s.summary()
    periods = summary["periods"]
    power = periods["gpu0:power_w"]
    assert power["asked_s"] == 0.05 and 0.045 < power["median_s"] < 0.058 and 15 <= power["count"] <= 22
    assert smi.calls[("power", "hA")] == smi.calls[("energy", "hA")] == smi.calls[("activity", "hA")] == power["count"]
    assert periods["gpu0:util_pct"]["asked_s"] == 0.05 and periods["gpu0:mem_mb"]["asked_s"] == 0.25
    assert summary["gpus"]["gpu0"] == {"util_mean": 80.0, "mem_mb_max": 1024.0, "power_field": "instant",
                                       "util_field": "polled"}
    # HIP 1: the averaged power, no utilization ("N/A", asked once) and no counter
    assert summary["gpus"]["gpu1"] == {"util_mean": None, "mem_mb_max": 1024.0, "power_field": "average",
                                       "util_field": None}
    assert smi.calls[("activity", "hB")] == 1 and smi.calls[("energy", "hB")] == 1
    assert summary["power_w"] == {"gpu0": 500.0, "gpu1": 300.0}
    assert summary["energy_method"] == {"gpu0": "counter", "gpu1": "integrated-power"}
    # the counter wrapped at 2^32 ticks within the first 0.4 s: undone, its joules those of 500 W
    energy = [x for x in s.samples if (x.source, x.metric) == ("gpu0", "energy_j")]
    assert [x.t for x in energy] == sorted(x.t for x in energy) and energy[0].value == 0.0
    assert summary["energy_j"]["gpu0"] == pytest.approx(500.0 * (energy[-1].t - energy[0].t), rel=0.05)
    assert summary["energy_j"]["gpu1"] == pytest.approx(300.0 * 1.0, rel=0.2)
    assert "gpu1:energy" in summary["unavailable"] and "gpu1:util" in summary["unavailable"]
    assert "gpu" not in summary["unavailable"] and "gpu0:energy_restarts" not in summary["unavailable"]


def test_sampler_follows_the_amd_gpus_it_is_given_by_hip_index():
    s = Sampler(config=SamplerConfig(rapl=False), nvml=NO_NVML, amdsmi=FakeAMDSMI(), gpus=[1])
    with s:
        time.sleep(0.15)
    assert {x.source for x in s.samples} == {"cpu", "gpu1"}
    assert {x.metric for x in s.samples if x.source == "gpu1"} == {"power_avg_w", "mem_mb"}  # hB: average power
    bad = Sampler(config=SamplerConfig(rapl=False), nvml=NO_NVML, amdsmi=FakeAMDSMI(), gpus=[2])
    assert "amdsmi has GPU(s) [0, 1]; asked for index(es) [2]" in bad.unavailable["gpu"]


def test_the_runs_amd_gpu_is_picked_by_pci_address_and_an_unmatched_one_is_said():
    """A seed given GPU 1 (HIP_VISIBLE_DEVICES=1) is cuda:0 to torch, HIP index 1 to amdsmi: its PCI
    address picks it alone, since HIP's UUID and amdsmi's are not formed alike."""
    picked = Sampler(config=SamplerConfig(rapl=False), nvml=NO_NVML, amdsmi=FakeAMDSMI(),
                     run_gpus=[RunGpu("GPU-x", "0000:c1:00")])
    assert [g.source for g in picked._gpus] == ["gpu1"] and "gpu_selection" not in picked.unavailable
    lost = Sampler(config=SamplerConfig(rapl=False), nvml=NO_NVML, amdsmi=FakeAMDSMI(),
                   run_gpus=[RunGpu("GPU-x", "0000:99:00")])
    assert [g.source for g in lost._gpus] == ["gpu0", "gpu1"]  # every GPU, never none
    assert lost.unavailable["gpu_selection"] == ("every GPU sampled: the run's GPU(s) 0000:99:00 not all among "
                                                 "amdsmi's (0000:83:00, 0000:c1:00)")
    blind = Sampler(config=SamplerConfig(rapl=False), nvml=NO_NVML, amdsmi=FakeAMDSMI(), run_gpus=[RunGpu("u", None)])
    assert len(blind._gpus) == 2
    assert blind.unavailable["gpu_selection"] == "every GPU sampled: torch gave no PCI address for the run's GPU(s)"

    class Old(FakeAMDSMI):  # a library without the BDF call
        amdsmi_get_gpu_device_bdf = None

    old = Sampler(config=SamplerConfig(rapl=False), nvml=NO_NVML, amdsmi=Old(), run_gpus=[RunGpu("u", "0000:c1:00")])
    assert len(old._gpus) == 2 and old.unavailable["gpu_selection"].startswith("every GPU sampled: amdsmi gave no BDF")


def test_without_hip_ids_amdsmis_own_order_is_the_index():
    class Old(FakeAMDSMI):  # amdsmi before 6.4: no enumeration info
        def amdsmi_get_gpu_enumeration_info(self, h):
            raise AttributeError("module 'amdsmi' has no attribute 'amdsmi_get_gpu_enumeration_info'")

    _, handles = open_amdsmi(Old(), {})
    assert handles == [(0, "hB"), (1, "hA")]


def test_no_gpu_library_records_why_for_each(capsys):
    class NoRocm(FakeAMDSMI):
        def amdsmi_init(self, flag=2):
            raise AmdSmiLibraryException(34)  # AMDSMI_STATUS_DRIVER_NOT_LOADED

    s = Sampler(config=SamplerConfig(rapl=False), nvml=NO_NVML, amdsmi=NoRocm())
    un = s.unavailable["gpu"]
    assert "NVML unavailable (OSError: libnvidia-ml.so.1: not found)" in un and "amdsmi unavailable" in un
    assert "34" in un and s._gpus == []
    # the installed package without ROCm's libamd_smi.so (this machine): a reason, nothing printed
    why = {}
    if open_amdsmi(None, why) is None:
        assert why["gpu"].startswith("amdsmi unavailable") and capsys.readouterr().out == ""


def test_availability_names_the_library_that_reads_the_gpus():
    from pathlib import Path

    got = availability(nvml=NO_NVML, rapl_root=Path("/nonexistent"), amdsmi=FakeAMDSMI())
    assert got["gpus"] == 2 and got["gpu_library"] == "amdsmi" and "gpu" not in got["unavailable"]


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _gpu(smi, unavailable=None):
    return AmdGpu(smi, 0, "hA", {} if unavailable is None else unavailable)


def _run(g, smi, clock, seconds, step=0.05):
    """Ticks of ``g`` every ``step`` s of the stand-in's clock; the samples, finish() included."""
    out = []
    for k in range(round(seconds / step) + 1):
        clock.now = 1000.0 + k * step
        out += g.tick(k * step)
    return out + g.finish()


def test_counter_wraps_at_32_bits_and_a_restart_is_not_charged():
    clock = Clock()
    smi = FakeAMDSMI(clock)
    un = {}
    g = _gpu(smi, un)
    samples = _run(g, smi, clock, 3.0)
    energy = [x for x in samples if x.metric == "energy_j"]
    # 200 J to the wrap at 0.4 s, then on: 500 W throughout, the wrap invisible
    assert energy[-1].value == pytest.approx(500.0 * 3.0, rel=1e-3) and not g.restarts
    assert g.checked and g.powers == []  # the power kept for the check is not kept on
    steps = [b.value - a.value for a, b in zip(energy, energy[1:])]
    assert min(steps) == pytest.approx(25.0, rel=0.01) and max(steps) == pytest.approx(25.0, rel=0.01)
    # the driver reloaded: the counter starts again near 0, far from a wrap: that step is not charged
    real = smi.ticks
    smi.ticks = lambda h: 1000
    clock.now += 0.05
    assert g.tick(3.05)[1].value == energy[-1].value and g.restarts == 1
    smi.ticks = lambda h: 1000 + int(25.0 / (RES / 1e6))
    assert g.tick(3.10)[1].value == pytest.approx(energy[-1].value + 25.0, rel=1e-3)
    assert "went back 1 time(s)" in un["gpu0:energy_restarts"]
    smi.ticks = real


def test_counter_readings_are_held_until_checked_against_power():
    clock = Clock()
    smi = FakeAMDSMI(clock)
    g = _gpu(smi)
    early = []
    for k in range(10):  # 0.45 s: the check needs CHECK_S of readings
        clock.now = 1000.0 + 0.05 * k
        early += g.tick(0.05 * k)
    assert not [x for x in early if x.metric == "energy_j"] and len(g.held) == 10
    released = g.finish()  # a sampler stopped before CHECK_S: what it holds, checked
    assert [x.t for x in released] == pytest.approx([0.05 * k for k in range(10)]) and g.finish() == []


def test_a_counter_that_stands_still_is_refused_and_energy_comes_from_power():
    clock = Clock()

    class Stuck(FakeAMDSMI):  # ROCm/amdsmi issues 22 and 38: the accumulator does not move
        def ticks(self, h):
            return 8152136

    un = {}
    g = _gpu(Stuck(clock), un)
    samples = _run(g, None, clock, amd_gpu.CHECK_S + 0.5)
    assert not [x for x in samples if x.metric == "energy_j"] and not g.counter
    assert "read 0.0 J where its power read 1000.0 J" in un["gpu0:energy"]
    assert "gpu0:energy_j" not in g.asked(0.05, 0.5) and len([x for x in samples if x.metric == "power_w"]) == 51


def test_na_power_and_a_gpu_that_stops_answering():
    class Dark(FakeAMDSMI):
        def amdsmi_get_power_info(self, h):
            return {**super().amdsmi_get_power_info(h), "current_socket_power": "N/A", "average_socket_power": "N/A"}

    un = {}
    g = _gpu(Dark(Clock()), un)
    assert {x.metric for x in g.tick(0.0)} == {"util_pct"}  # its counter reading held for the check
    assert "N/A for current_socket_power and average_socket_power" in un["gpu0:power"]
    assert not any(k.endswith(("power_w", "power_avg_w")) for k in g.asked(0.05, 0.5))

    class Lost(FakeAMDSMI):
        def amdsmi_get_power_info(self, h):
            if h == "hA" and time.time() - self.born > 0.2:
                raise AmdSmiLibraryException(34)  # the driver went away
            return super().amdsmi_get_power_info(h)

    s = Sampler(config=SamplerConfig(rapl=False), nvml=NO_NVML, amdsmi=Lost())
    with s:
        time.sleep(0.6)
    assert "amdsmi stopped answering" in s.unavailable["gpu0"] and "gpu1" not in s.unavailable
    last_gpu0 = max(x.t for x in s.samples if x.source == "gpu0" and x.metric == "power_w")
    assert last_gpu0 < 0.35 and max(x.t for x in s.samples if x.source == "gpu1") > 0.5


@pytest.mark.cuda  # ROCm's torch sees its GPUs as cuda devices; unmarked tests are kept off them
def test_real_amdsmi_holds_the_period():
    """The real library's path: skipped where ROCm's libamd_smi.so or an AMD GPU is missing."""
    why = {}
    if open_amdsmi(None, why) is None:
        pytest.skip(why["gpu"])
    s = Sampler(config=SamplerConfig(rapl=False), nvml=NO_NVML, gpus=None)
    with s:
        time.sleep(2.5)
    periods = s.summary()["periods"]
    power = periods.get("gpu0:power_w") or periods["gpu0:power_avg_w"]
    assert power["count"] >= 10 and power["median_s"] < 1.2 * power["asked_s"]
    assert s.summary()["gpus"]["gpu0"]["mem_mb_max"] > 0


def test_amd_samples_read_as_nvidia_ones_downstream():
    """Energy to accuracy, the GPU busy share and the report's power trace read an AMD run's rows
    (stored as the recorder stores them: dicts on the TTA clock) as they read NVML's."""
    from speechperf.studies.busy import busy
    from speechperf.studies.report.figures import _power_series
    from speechperf.telemetry.energy import to_accuracy

    clock = Clock()
    g = _gpu(FakeAMDSMI(clock))
    rows = [{"t": x.t, "source": x.source, "metric": x.metric, "value": x.value, "segment": 1.0}
            for x in _run(g, None, clock, 3.0)]
    assert to_accuracy(rows, 2.5) == pytest.approx(500.0 * 2.5, rel=1e-3)  # the counter's 2.5 s
    its = [{"iteration": 1, "epoch": 1, "clock_s": 2.0, "step_s": 2.0}]
    share = busy(rows, its, [{"epoch": 1, "clock_s": 3.0, "eval_s": 1.0}], 3.0, "cuda:0")
    assert share["device"] == "GPU" and share["tta %"] == 80.0 and share["sources"] == ["gpu0"]
    [(source, label, (t, watts))] = list(_power_series(rows))
    assert (source, label) == ("gpu0", "instant") and set(watts) == {500.0} and len(t) == 61


def test_the_environment_reads_the_driver_through_amdsmi_on_rocm(monkeypatch):
    import sys

    from speechperf.hardware.environment import _driver

    smi = FakeAMDSMI()
    smi.amdsmi_get_gpu_driver_info = lambda h: {"driver_name": "amdgpu", "driver_version": "6.12.12",
                                                "driver_date": "2015/01/01 00:00"}
    monkeypatch.setitem(sys.modules, "amdsmi", smi)
    assert _driver(rocm=True) == "6.12.12"
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # not installed: recorded, not fatal
    assert _driver(rocm=True) == "unavailable (ModuleNotFoundError)"
