"""The one energy rule: counter where a source has one, else integrated power; the sampler's
summary and the report's energy to accuracy give the same joules for the same samples."""
import pytest

from speechperf.errors import SpeechperfError

from speechperf.telemetry import energy
from speechperf.telemetry.sample import Sample
from speechperf.telemetry.sampler import Sampler, SamplerConfig

SAMPLES = [
    Sample(0.0, "gpu0", "power_w", 100.0), Sample(1.0, "gpu0", "power_w", 300.0), Sample(2.0, "gpu0", "power_w", 300.0),
    Sample(0.0, "gpu0", "energy_j", 5000.0), Sample(2.0, "gpu0", "energy_j", 5450.0),  # counter: 450 J, not 500
    Sample(0.0, "gpu1", "power_avg_w", 50.0), Sample(2.0, "gpu1", "power_avg_w", 50.0),
    Sample(0.0, "gpu1", "power_w", 100.0), Sample(2.0, "gpu1", "power_w", 200.0),  # instant beats averaged
    Sample(0.0, "rapl:intel-rapl:0", "energy_j", 0.0), Sample(2.0, "rapl:intel-rapl:0", "energy_j", 40.0),
    Sample(0.0, "rapl:intel-rapl:0:0", "energy_j", 0.0), Sample(2.0, "rapl:intel-rapl:0:0", "energy_j", 30.0),
    Sample(1.0, "cpu", "util_machine_pct", 50.0),
]


def test_counter_else_integrated_power():
    assert energy.by_source(SAMPLES) == {"gpu0": (450.0, "counter"), "gpu1": (300.0, "integrated-power"),
                                         "rapl:intel-rapl:0": (40.0, "counter"), "rapl:intel-rapl:0:0": (30.0, "counter")}
    first = energy.by_source(SAMPLES, until=1.0, top_only=True)
    assert first == {"gpu0": (0.0, "counter"), "gpu1": (0, "integrated-power"), "rapl:intel-rapl:0": (0.0, "counter")}
    assert energy.total(SAMPLES, 2.0) == 450.0 + 300.0 + 40.0  # the package's cores are inside its 40 J
    assert energy.total(SAMPLES, None) is None and energy.total(SAMPLES[-1:], 2.0) is None
    assert energy.integrate([(0.0, 100.0), (1.0, 300.0)]) == 200.0


def test_sampler_summary_and_report_read_the_same_rule():
    from speechperf.studies.report.comparison import energy_by_source, energy_until

    s = Sampler(config=SamplerConfig(gpus=False, rapl=False))
    s.samples = list(SAMPLES)
    summary = s.summary()
    assert {k: (summary["energy_j"][k], summary["energy_method"][k]) for k in summary["energy_j"]} == \
        energy.by_source(SAMPLES)
    assert summary["power_w"]["rapl:intel-rapl:0"] == pytest.approx(20.0)  # RAPL power from its counter
    rows = [{"t": x.t, "source": x.source, "metric": x.metric, "value": x.value} for x in SAMPLES]
    assert energy_by_source({"samples": rows}, 2.0) == energy.by_source(SAMPLES, 2.0, top_only=True)
    assert energy_until({"samples": rows}, 2.0) == 790.0


# ---- recorded series: energy to accuracy over each kind of source, whole and resumed ----------------
def _rows(series, source, metric, segment=None):
    """Stored sample rows (results/schema.py) of (t, value) points."""
    return [{"t": t, "source": source, "metric": metric, "value": v, "segment": segment} for t, v in series]


def test_gpu_counter_to_the_tta_moment():
    # NVML total energy in J (counts since the driver loaded): 200 W for 4 s, read every 0.5 s
    rows = _rows([(0.5 * k, 90_000.0 + 100.0 * k) for k in range(9)], "gpu0", "energy_j", 1.0)
    assert energy.to_accuracy(rows, 3.0) == pytest.approx(600.0)  # the readings at 0 s and 3 s
    assert energy.to_accuracy(rows, None) is None  # target not reached: no energy to it


def test_gpu_counter_of_a_resumed_run_leaves_its_down_time_out():
    # process 1 ran 0-2 s of the TTA clock; down 10 min (NVML kept counting: +120 kJ of another
    # process's work); process 2 continued the clock from 2 s to 4 s at 300 W
    first = _rows([(0.0, 1000.0), (1.0, 1200.0), (2.0, 1400.0)], "gpu0", "energy_j", 1.0)
    second = _rows([(2.0, 121_400.0), (3.0, 121_700.0), (4.0, 122_000.0)], "gpu0", "energy_j", 2.0)
    assert energy.to_accuracy(first + second, 4.0) == pytest.approx(400.0 + 600.0)
    assert energy.to_accuracy(first + second, 3.0) == pytest.approx(400.0 + 300.0)
    # the TTA moment as `tta` has it, from minutes: 3.791653 / 60 * 60 is an ulp short of the reading at it
    at = [dict(r, t=3.791653) if r["t"] == 4.0 else r for r in first + second]
    assert 3.791653 / 60 * 60 < 3.791653 and energy.to_accuracy(at, 3.791653 / 60 * 60) == pytest.approx(1000.0)


def _rapl_zone(root, top_uj: int):
    zone = root / "intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "name").write_text("package-0\n")
    (zone / "max_energy_range_uj").write_text(f"{top_uj}\n")
    return zone


def _rapl_process(zone, raw_uj: list[int], t0: float, segment: float) -> list[dict]:
    """What one process's sampler stores: the counters read once a second, each wrap undone
    (telemetry/rapl.py), joules since that process's sampler started."""
    from speechperf.telemetry.rapl import RaplCounters

    (zone / "energy_uj").write_text(f"{raw_uj[0]}\n")
    counters = RaplCounters(zone.parent)
    points = [(t0, counters.read()[f"rapl:{zone.name}"])]
    for k, raw in enumerate(raw_uj[1:], 1):
        (zone / "energy_uj").write_text(f"{raw}\n")
        points.append((t0 + k, counters.read()[f"rapl:{zone.name}"]))
    return _rows(points, f"rapl:{zone.name}", "energy_j", segment)


def test_rapl_counter_with_wraparound(tmp_path):
    zone = _rapl_zone(tmp_path / "powercap", top_uj=1_000_000)  # wraps at 1 J
    # 0.4 J a second: 0.2 -> 0.6 -> wraps -> 0.0 -> 0.4 -> 0.8 (each step +0.4 J)
    rows = _rapl_process(zone, [200_000, 600_000, 0, 400_000, 800_000], 0.0, 1.0)
    assert energy.to_accuracy(rows, 4.0) == pytest.approx(1.6)
    assert energy.to_accuracy(rows, 2.0) == pytest.approx(0.8)  # across the wrap


def test_rapl_counter_of_a_resumed_run_restarts_in_each_process(tmp_path):
    zone = _rapl_zone(tmp_path / "powercap", top_uj=1_000_000)
    first = _rapl_process(zone, [900_000, 100_000, 300_000], 0.0, 1.0)  # 0.2 J/s, a wrap: 0.4 J to t = 2
    second = _rapl_process(zone, [500_000, 800_000, 100_000], 2.0, 2.0)  # restarted at 0 J: 0.6 J from t = 2 to 4
    assert [r["value"] for r in second][0] == 0.0
    assert energy.to_accuracy(first + second, 4.0) == pytest.approx(0.4 + 0.6)
    # rows of an older release (no segment): the restart shows as a counter going down, not charged
    older = [{**r, "segment": None} for r in first + second]
    assert energy.to_accuracy(older, 4.0) == pytest.approx(0.4 + 0.6)


def test_power_only_is_integrated_within_each_process():
    rows = _rows([(0.0, 100.0), (1.0, 100.0), (2.0, 300.0)], "gpu0", "power_w", 1.0)
    assert energy.to_accuracy(rows, 2.0) == pytest.approx(100.0 + 200.0)
    # resumed at 2 s after down time: the second process's samples start again at 2 s, 50 W; no
    # trapezoid joins the two processes (their samples share the clock, not the wall time)
    resumed = rows + _rows([(2.0, 50.0), (3.0, 50.0), (4.0, 50.0)], "gpu0", "power_w", 2.0)
    assert energy.to_accuracy(resumed, 4.0) == pytest.approx(300.0 + 100.0)


def test_no_energy_sample_is_none_and_says_why_samples_after_the_tta_are_an_error():
    util = _rows([(0.0, 50.0), (1.0, 60.0)], "cpu", "util_machine_pct")
    assert energy.to_accuracy(util, 1.0) is None
    env = {"telemetry": {"unavailable": {"gpu": "NVML found no GPU", "rapl": "no RAPL zones under /sys/class/powercap"}}}
    assert energy.why_missing(env) == "gpu: NVML found no GPU; rapl: no RAPL zones under /sys/class/powercap"
    assert energy.why_missing({}) == "the run did not record which power sources were available"
    late = _rows([(50.0, 1.0), (60.0, 2.0)], "gpu0", "energy_j", 1.0)
    with pytest.raises(SpeechperfError, match="run x: its power and energy samples start at 50.0 s"):
        energy.to_accuracy(late, 10.0, "run x")


def test_the_price_note_says_why_the_energy_is_missing():
    from speechperf.hardware.platforms import load, price_performance

    note = price_performance(2.0, load("sys1"))["price note"]
    env = {"telemetry": {"unavailable": {"rapl": "no RAPL zones under /sys/class/powercap"}}}
    assert energy.explained(note, env) == note.replace(
        "no energy counter or power samples", "no energy counter or power samples (rapl: no RAPL zones under "
        "/sys/class/powercap)") != note
    assert energy.explained(None, env) is None
