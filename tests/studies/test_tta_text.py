"""The narrow TTA table's words for what reaching the target took (studies/tta_text.py)."""
from speechperf.studies.tta_text import to_accuracy


def test_a_run_still_going_has_not_failed_its_target():
    assert to_accuracy({"minutes": None, "state": "unfinished"}) == "none yet: unfinished"
    assert to_accuracy({"minutes": None, "state": "never reached"}) == "none: unreached"


def test_a_reached_target_says_its_energy_and_cost():
    row = {"minutes": 3.0, "state": "reached", "energy to accuracy kWh": 0.0021, "cost to accuracy $": 0.013}
    assert to_accuracy(row) == "0.0021 kWh $0.013"
