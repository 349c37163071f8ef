"""The measurement method against a fake clock: exact step times, no sleeping."""
from types import SimpleNamespace

import pytest
import torch

from speechperf.telemetry import timing


class Clock:
    """perf_counter that only moves when a fake step runs: ``durations`` in order, the last repeated."""

    def __init__(self, durations):
        self.now, self.durations, self.steps, self.syncs = 0.0, list(durations), 0, []

    def perf_counter(self):
        return self.now

    def step(self):
        self.now += self.durations[min(self.steps, len(self.durations) - 1)]
        self.steps += 1


class Meter:
    """Stands in for PowerMeter: no power source."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def result(self, samples):
        return {"power_w": None, "joules_per_sample": None, "energy": "unavailable: test"}


@pytest.fixture
def clock(monkeypatch):
    def make(durations):
        c = Clock(durations)
        monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=c.perf_counter))
        monkeypatch.setattr(timing, "_sync", lambda dev: c.syncs.append(c.steps))
        return c
    return make


CPU = torch.device("cpu")


def test_warm_up_until_the_step_time_is_stable(clock):
    c = clock([0.5, 0.3, 0.2, 0.15, 0.1, 0.1])  # autotuning, then steady at 0.1 s
    w = timing.warm_up(c.step, CPU, timing.Method(warmup_steps=1, warmup_seconds=100.0))
    # stable once the last 3 steps' median is within 5% of the 3 before: steps 7-9 (0.1) vs 4-6 (0.15, 0.1, 0.1)
    assert w == {"warmup_steps": 9, "warmup_s": pytest.approx(1.65), "warm": 1, "step_s": pytest.approx(0.1)}


def test_warm_up_stops_at_its_budget_and_says_not_warm(clock):
    c = clock([0.5, 0.4, 0.3, 0.2, 0.1, 0.05])
    w = timing.warm_up(c.step, CPU, timing.Method(warmup_steps=2, warmup_seconds=1.0))
    assert (w["warmup_steps"], w["warm"]) == (3, 0)  # 0.5 + 0.4 + 0.3 >= 1 s
    assert timing.warm_up(c.step, CPU, timing.Method(warmup_steps=0))["warmup_steps"] == 0


def test_timed_window_repeats_median_and_iqr(clock):
    c = clock([0.1] * 10 + [0.2] * 10 + [0.1] * 10)  # a slow middle third
    m = timing.Method(warmup_steps=0, seconds=3.0, repeats=3)
    r = timing.measure(c.step, CPU, m, samples_per_step=8, meter=Meter())
    assert r["iters"] == 20 and r["repeats"] == 3  # 10 x 0.1 + 10 x 0.2 = 3 s
    # windows of 7, 6, 7 steps: 7 x 0.1; 3 x 0.1 + 3 x 0.2; 7 x 0.2 -> 80, 53.3, 40 samples/s
    assert r["samples_per_s"] == pytest.approx(8 * 6 / 0.9)
    assert r["step_s"] == pytest.approx(0.15) and r["window_s"] == pytest.approx(3.0)
    assert r["noisy"] == 1 and r["spread_pct"] == pytest.approx(100 * 0.1 / 0.15)
    assert r["repeat_iqr_pct"] == pytest.approx(100 * (80 - 40) / (8 * 6 / 0.9))  # 3 repeats: IQR = range
    assert r["timer"] == "perf_counter" and r["energy"] == "unavailable: test"
    steady = timing.measure(clock([0.1]).step, CPU, m, meter=Meter())
    assert steady["noisy"] == 0 and steady["spread_pct"] == pytest.approx(0.0, abs=1e-9)


def test_fixed_iterations_and_minimum_and_maximum_steps(clock):
    c = clock([2.0])
    r = timing.measure(c.step, CPU, timing.Method(warmup_steps=0, seconds=1.0, min_steps=3), meter=Meter())
    assert r["iters"] == 3  # past the window, but at least min_steps
    r = timing.measure(clock([0.001]).step, CPU, timing.Method(warmup_steps=0, seconds=10.0, max_steps=300),
                       meter=Meter())
    assert r["iters"] == 300  # the paper's 300 calls on a CPU
    r = timing.measure(clock([0.5]).step, CPU, timing.Method(warmup_steps=0, iters=1), meter=Meter())
    assert r["iters"] == 1 and r["spread_pct"] is None and r["repeats"] == 1 and r["repeat_iqr_pct"] is None


class FakeEvent:
    """torch.cuda.Event on the fake clock: elapsed_time in ms between two records."""

    clock = None

    def __init__(self, enable_timing=True):
        self.t = None

    def record(self):
        self.t = FakeEvent.clock.now

    def elapsed_time(self, other):
        return 1000.0 * (other.t - self.t)


def test_cuda_path_times_with_events_and_synchronizes_only_around_the_window(clock, monkeypatch):
    c = clock([0.3, 0.2])
    FakeEvent.clock = c
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    dev = torch.device("cuda:0")
    m = timing.method("zoo", "cuda:0", warmup_steps=1, warmup_seconds=0.0, seconds=2.0)
    r = timing.measure(c.step, dev, m, meter=Meter())
    assert r["timer"].startswith("cuda events") and r["warmup_steps"] == 1
    timed_syncs = [s for s in c.syncs if s >= 1]  # syncs after the warm-up step
    assert timed_syncs == [1, 1, 1 + r["iters"]]  # end of warm-up step, before the window, after it: none between
    assert r["iters"] in (10, 11) and r["step_s"] == pytest.approx(0.2)  # 10 x 0.2 may sum to just under 2 s


def test_many_short_steps_are_marked_in_strides(clock, monkeypatch):
    c = clock([1e-5])
    FakeEvent.clock = c
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    m = timing.Method(warmup_steps=1, warmup_seconds=0.0, seconds=1.0)
    r = timing.measure(c.step, torch.device("cuda:0"), m, meter=Meter())
    stride = int(r["timer"].split(", ")[1].split()[0])
    assert stride == 50 and r["iters"] == pytest.approx(1e5, rel=0.01)  # 100,000 steps, 2,000 events
    assert r["step_s"] == pytest.approx(1e-5) and r["samples_per_s"] == pytest.approx(1e5)
    assert r["window_s"] == pytest.approx(1.0, abs=1e-3)


def test_default_methods_fit_the_gpu_goal_and_the_cpu_budget():
    zoo, ops = timing.method("zoo", "cuda:0"), timing.method("ops", "cuda")
    # default sweeps on one GPU: zoo fp32+amp 30 rows, ops 12 rows, each row at most warm-up budget + window
    worst = 30 * (zoo.warmup_seconds + zoo.seconds) + 12 * (ops.warmup_seconds + ops.seconds)
    assert worst < 6 * 60 and zoo.seconds >= 3 * zoo.energy_min_seconds / 2
    cpu = timing.method("zoo", "cpu")
    assert cpu.warmup_seconds + cpu.seconds == 5.0  # the CPU budget of the method before: 5 s timed per row
    assert timing.method("zoo", "cpu", seconds=None, repeats=5).repeats == 5
