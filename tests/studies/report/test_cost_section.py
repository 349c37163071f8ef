"""The report's cost section (speechperf/studies/report/sections.py ``cost``): a saved ``speechperf cost
--json`` drawn against device count with its rows and every assumption; without one the section says how
to give it; a malformed one refused before the report folder exists, naming the file."""
import json

from speechperf.cli import main
from speechperf.studies import cost
from speechperf.studies.report.html import build_report
from tests.studies.report.test_no_silent_gaps import _training_run

T = cost.Throughput((40.0, 50.0, 80.0), 3, 300.0, "hand")  # no power: device-hours and dollars only


def _saved(tmp_path, **kw):
    got = cost.cost(cost.CostRequest("fastconformer-l", hours=100, epochs=1, devices=6, **kw), T)
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(got))
    return path, got


def test_the_cost_is_drawn_against_device_count_with_its_assumptions(tmp_path):
    run = _training_run(tmp_path, "run", 1)
    path, got = _saved(tmp_path, price_per_hour=2.0)
    assert [r["devices"] for r in got["curve"]] == [1, 2, 4, 6] and [r["devices"] for r in got["rows"]] == [1, 6]
    assert got["curve"][1]["usd"] == 4.0 and got["curve"][1]["wall_h"] == 1.0  # 2 device-hours at $2, over 2 devices
    page = build_report([run], tmp_path / "rep", costs=[path]).read_text()
    assert (tmp_path / "rep" / "cost.png").stat().st_size > 10_000
    section = page[page.index("Cost of a training run"):]
    assert "6 devices: ASSUMED the measured 1-device throughput x 6 x efficiency 1" in section
    assert "cost.json: power: no power reading: energy not computed" in section
    csv = (tmp_path / "rep" / "cost.csv").read_text().splitlines()
    assert len(csv) == 3 and csv[0].startswith("file,workload,devices,efficiency,wall_h,device_h")


def test_without_cost_data_the_section_says_how_to_give_it(tmp_path):
    run = _training_run(tmp_path, "run", 1)
    page = build_report([run], tmp_path / "rep").read_text()
    assert "no cost data: give report --cost COST.json" in page


def test_a_malformed_cost_file_is_refused_before_the_report_exists(tmp_path, capsys):
    run = _training_run(tmp_path, "run", 1)
    path, got = _saved(tmp_path)
    bad = tmp_path / "bad.json"
    for text in ("[1, 2]", json.dumps({**got, "curve": [{"devices": 0, "device_h": 1.0}]}), "{"):
        bad.write_text(text)
        assert main(["report", str(run), "--out", str(tmp_path / "rep"), "--cost", str(bad)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{bad}: not a speechperf cost --json output" in err
        assert not (tmp_path / "rep").exists()
