"""Whether a run shared its machine (telemetry/contention.py): the rule, the share, the flag."""
import pytest

from speechperf.hardware.measured_peak import contended
from speechperf.telemetry import contention


def test_other_processes_take_needed_cores_beyond_those_left_free_and_the_slack():
    assert not contention.took_needed(10.0, threads=2, cpus=2)  # 0.2 of a core: the slack (10% of 2 CPUs)
    assert contention.took_needed(11.0, threads=2, cpus=2)
    assert not contention.took_needed(55.0, threads=1, cpus=2)  # the other core was free: 1.1 <= 1 + 0.2
    assert contention.took_needed(61.0, threads=1, cpus=2)
    assert not contention.took_needed(80.0, threads=4, cpus=16)  # 12.8 CPUs of the 12 left free + 1.6
    assert contended(11.0, 2, 2) and not contended(10.0, 2, 2)  # the CPU peak's rule is the same one


def test_the_others_share_is_the_machine_less_the_run():
    assert contention.others_pct(machine_s=3.0, own_s=2.0, wall_s=1.0, cpus=2) == pytest.approx(50.0)
    assert contention.others_pct(1.9, 2.0, 1.0, 2) == 0.0  # clocks ticking apart: never below 0
    assert contention.others_pct(9.0, 0.0, 1.0, 2) == 100.0 and contention.others_pct(1.0, 0.0, 0.0, 2) == 0.0


def _samples(values, step=1.0):
    return [{"t": step * (i + 1), "source": "cpu", "metric": "others_pct", "value": v} for i, v in enumerate(values)]


def test_a_run_shared_its_machine_when_contended_seconds_reach_five_percent():
    got = contention.shared(_samples([0, 50, 50, 50, 0, 0, 0, 0, 0, 20]) + [
        {"t": 3.0, "source": "cpu", "metric": "util_machine_pct", "value": 100.0}], threads=2, cpus=2)
    assert got == {"shared": True, "contended %": pytest.approx(40.0), "others % mean": pytest.approx(17.0),
                   "samples": 10, "first s": 2.0, "last s": 10.0, "threads": 2, "cpus": 2}
    assert contention.shared(_samples([0, 50, 50, 50, 0]), 2, 2, until=1.0)["shared"] is False  # before the TTA: quiet
    half = contention.shared(_samples([0, 50, 50, 50, 0]), 2, 2, until=1.5)  # the sample ending at 2 s: its half before
    assert half["contended %"] == pytest.approx(100 * 0.5 / 1.5) and half["samples"] == 2
    assert contention.shared(_samples([50] + [0] * 19), 2, 2)["shared"]  # 1 s of 20: 5%
    quiet = contention.shared(_samples([50] + [0] * 20), 2, 2)  # 1 s of 21: 4.8%
    assert not quiet["shared"] and quiet["contended %"] == pytest.approx(100 / 21)
    assert not contention.shared(_samples([50] * 10), threads=1, cpus=2)["shared"]  # one thread: the other core was free


def test_the_flag_short_and_in_words():
    got = contention.shared(_samples([0, 60, 60, 0]), 2, 2)
    assert contention.short(got) == "yes 50%" and contention.short({**got, "shared": False}) == "no"
    assert contention.words(got) == "shared its machine (50% of its clock): rerun it alone"
    assert contention.words({**got, "shared": False}) is None and contention.short(None) is None
    assert contention.shared([], 2, 2) is None and contention.shared(_samples([1]), None, 2) is None  # older runs
