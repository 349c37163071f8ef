"""The shared-machine flag beside a TTA (studies/tta.py, the report's tables) and the floor's spread
columns: computed up to the TTA from the run's own samples, empty for runs that did not record them."""
from speechperf.studies.report.comparison import floor_columns, shared_column
from speechperf.studies.tta import shared_columns

ENV = {"torch_threads": 2, "cpu_cores_logical": 2}
# others took half the machine in the first 3 s, nothing in the next 57 s
SAMPLES = [{"t": float(t), "source": "cpu", "metric": "others_pct", "value": 50.0 if t <= 3 else 0.0}
           for t in range(1, 61)]


def test_the_flag_is_computed_up_to_the_tta():
    assert shared_columns(SAMPLES, ENV, 20.0)["shared"] == "yes 15%"  # 3 s of 20
    late = shared_columns(SAMPLES, ENV, 60.0)  # 3 s of 60: 5%
    assert late["shared"] == "yes 5%" and late["shared machine"]["contended %"] == 5.0
    assert late["shared note"].startswith("shared its machine (")
    quiet = shared_columns(SAMPLES[3:], ENV, 60.0)
    assert (quiet["shared"], quiet["shared note"]) == ("no", None)
    older = shared_columns([], ENV, 60.0)  # recorded before the sampler took the figure
    assert older == {"shared": None, "shared machine": None, "shared note": None}


def test_the_reports_columns():
    run = {"samples": SAMPLES, "env": ENV}
    assert shared_column(run, 20.0) == {"shared": "yes 15%"} and shared_column({"samples": [], "env": {}}, 9.0) == {
        "shared": None}
    floor = {"loop_over_floor": 1.2, "loop_over_floor_p10": 1.05, "loop_over_floor_p90": 1.6}
    assert floor_columns({"floor": floor}) == {"loop/floor": 1.2, "loop/floor p10": 1.05, "loop/floor p90": 1.6}
    assert floor_columns({"floor": {"loop_over_floor": 1.08}})["loop/floor p10"] is None  # an older run's
    assert floor_columns(None) == {"loop/floor": None, "loop/floor p10": None, "loop/floor p90": None}
