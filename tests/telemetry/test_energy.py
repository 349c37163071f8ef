"""The one energy rule: counter where a source has one, else integrated power; the sampler's
summary and the report's energy to accuracy give the same joules for the same samples."""
import pytest

from speechperf.telemetry import energy
from speechperf.telemetry.sampler import Sample, Sampler, SamplerConfig

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
    from speechperf.report.aggregate import energy_by_source, energy_until

    s = Sampler(config=SamplerConfig(gpus=False, rapl=False))
    s.samples = list(SAMPLES)
    summary = s.summary()
    assert {k: (summary["energy_j"][k], summary["energy_method"][k]) for k in summary["energy_j"]} == \
        energy.by_source(SAMPLES)
    assert summary["power_w"]["rapl:intel-rapl:0"] == pytest.approx(20.0)  # RAPL power from its counter
    rows = [{"t": x.t, "source": x.source, "metric": x.metric, "value": x.value} for x in SAMPLES]
    assert energy_by_source({"samples": rows}, 2.0) == energy.by_source(SAMPLES, 2.0, top_only=True)
    assert energy_until({"samples": rows}, 2.0) == 790.0
