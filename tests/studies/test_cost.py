"""``speechperf cost`` (speechperf/studies/cost.py): the arithmetic against hand computation, every
assumption said, a saved ``bench scale --json`` output (fixtures/bench_scale.json: recorded on this
project's 2-core Xeon) read as data end to end through the CLI, a run folder's rates against its own
database, and bad input refused in one line naming the value or file."""
import json
import statistics
from pathlib import Path

import pytest

from speechperf.cli import main
from speechperf.studies import cost as C

FIXTURE = Path(__file__).parent / "fixtures" / "bench_scale.json"
T = C.Throughput(rates=(40.0, 50.0, 80.0), steps=3, audio_per_step=300.0, source="hand", power_w=300.0,
                 power_note="300.0 W measured")


def test_one_estimate_by_hand():
    # 100 h of audio at 50 audio s/s on one device: 7,200 s = 2 h; 300 W x 2 h = 0.6 kWh; $2/h x 2 h = $4
    assert C.estimate(100 * 3600, 50.0, 1, 1.0, 300.0, 2.0) == {"wall_h": 2.0, "device_h": 2.0, "kwh": 0.6, "usd": 4.0}
    # 8 devices at 75%: 50 x 8 x 0.75 = 300 audio s/s: 1,200 s = 1/3 h of wall, 8/3 device-hours
    got = C.estimate(100 * 3600, 50.0, 8, 0.75, 300.0, 2.0)
    assert got["wall_h"] == pytest.approx(1 / 3, rel=1e-12) and got["device_h"] == pytest.approx(8 / 3, rel=1e-12)
    assert got["kwh"] == pytest.approx(0.8, rel=1e-12) and got["usd"] == pytest.approx(16 / 3, rel=1e-12)
    assert C.estimate(3600, 1.0, 1, 1.0, None, None) == {"wall_h": 1.0, "device_h": 1.0, "kwh": None, "usd": None}


def test_the_spread_runs_from_the_fastest_to_the_slowest_step():
    one, eight = C.rows(100 * 3600, T, 8, 0.5, 2.0)
    assert (one["devices"], one["efficiency"], eight["devices"], eight["efficiency"]) == (1, 1.0, 8, 0.5)
    # one device: 360,000 s / 80 = 1.25 h (the fastest step), / 50 = 2 h, / 40 = 2.5 h (the slowest)
    assert (one["device_h_low"], one["device_h"], one["device_h_high"]) == (1.25, 2.0, 2.5)
    assert (one["kwh_low"], one["kwh"], one["kwh_high"]) == (0.375, 0.6, 0.75)
    assert (one["usd_low"], one["usd"], one["usd_high"]) == (2.5, 4.0, 5.0)
    # 8 devices at 50%: twice one device's device-hours (4), over 8 devices: 0.5 h of wall
    assert eight["wall_h"] == 0.5 and eight["device_h"] == 4.0 and (eight["usd_low"], eight["usd_high"]) == (5.0, 10.0)
    assert [r["devices"] for r in C.rows(3600, T, 1, 0.5, None)] == [1]  # N = 1: one row


def test_every_assumption_is_printed_and_nothing_is_invented():
    req = C.CostRequest("fastconformer-l", hours=50, epochs=2, devices=4, platform="h100-sxm")
    got = C.cost(req, C.Throughput((40.0, 50.0, 80.0), 3, 300.0, "hand"))  # no power reading
    lines = got["assumptions"]
    assert lines[0] == "workload: fastconformer-l"
    assert lines[1] == "training: 50 h of audio x 2 epochs = 100.0 h of audio"
    assert lines[2].startswith("throughput: hand; audio s/s per step min 40.00, median 50.00, max 80.00")
    assert lines[3] == ("4 devices: ASSUMED the measured 1-device throughput x 4 x efficiency 1 (the default: an "
                        "assumption, not measured); no scaling was measured for 4 devices")
    assert lines[4].startswith("price: $3.99 per device-hour: NVIDIA H100 SXM 80 GB, RunPod")
    assert "(2026-11-09)" in lines[4]
    assert lines[5] == "power: no power reading: energy not computed"
    assert lines[-1] == C.UNCOUNTED
    one, four = got["rows"]
    assert one["kwh"] is None and one["usd"] == pytest.approx(3.99 * 2.0) and four["device_h"] == pytest.approx(2.0)
    steps = C.cost(C.CostRequest("fastconformer-l", hours=100, steps=1200, devices=1, price_per_hour=1.5), T)
    assert steps["throughput"]["audio_s"] == 1200 * 300.0  # 100 h: one pass
    assert steps["assumptions"][1].startswith("training: 1,200 steps of the measured batches' mean 300.0 audio s = "
                                              "100.0 h of audio (1.00 passes over 100 h)")
    assert steps["assumptions"][4] == "price: $1.5 per device-hour (--price-per-hour, given)"
    assert steps["rows"][0]["usd"] == 3.0 and steps["rows"][0]["kwh"] == 0.6  # 2 device-hours at 300 W


def _fixture_row():
    (row,) = [r for r in json.loads(FIXTURE.read_text()) if r["workload"] == "fastconformer-l"]
    return row


def test_the_cli_on_a_saved_bench_scale_output(capsys):
    row = _fixture_row()
    code = main(["cost", "fastconformer-l", "--hours", "960", "--epochs", "10", "--from", str(FIXTURE),
                 "--platform", "h100-sxm", "--devices", "8", "--json"])
    assert code == 0
    got = json.loads(capsys.readouterr().out)
    lo, mid, hi = row["audio_s_per_s_min"], row["audio_s_per_s_median"], row["audio_s_per_s_max"]
    assert (got["throughput"]["min"], got["throughput"]["median"], got["throughput"]["max"]) == (lo, mid, hi)
    one, eight = got["rows"]
    hours = 960 * 10 * 3600 / mid / 3600  # by hand: the corpus's audio over the median step's rate
    assert one["device_h"] == pytest.approx(hours, rel=1e-12) and one["usd"] == pytest.approx(3.99 * hours, rel=1e-12)
    assert one["device_h_low"] == pytest.approx(960 * 10 / hi, rel=1e-12)
    assert eight["wall_h"] == pytest.approx(hours / 8, rel=1e-12) and eight["efficiency"] == 1.0
    assert (one["kwh"] is None) == (row["power_w"] is None)
    assert any("ASSUMED" in line for line in got["assumptions"])
    assert main(["cost", "fastconformer-l", "--hours", "960", "--epochs", "10", "--from", str(FIXTURE)]) == 0
    text = capsys.readouterr().out
    assert "devices" in text.splitlines()[0] and "no price: the saved measurement names no machine" in text
    assert "device-h range" in text and "ASSUMED" in text


def test_a_measured_scaling_efficiency_is_used_for_its_device_count(tmp_path):
    rows = json.loads(FIXTURE.read_text())
    rows.append({**_fixture_row(), "world": 8, "scaling_efficiency": 0.8})
    saved = tmp_path / "scale.json"
    saved.write_text(json.dumps(rows))
    got = C.cost(C.CostRequest("fastconformer-l", hours=10, epochs=1, devices=8, efficiency=0.5, source=saved))
    assert got["rows"][1]["efficiency"] == 0.8
    assert "8 devices: measured scaling efficiency 0.800 (--efficiency 0.5 not used)" in got["assumptions"]
    got = C.cost(C.CostRequest("fastconformer-l", hours=10, epochs=1, devices=4, efficiency=0.5, source=saved))
    assert got["rows"][1]["efficiency"] == 0.5 and "(given: an assumption)" in got["assumptions"][3]


def test_a_run_folders_rates_are_its_database_rows(tiny_run):
    from speechperf.results.view import RunView

    with RunView.open(tiny_run) as r:
        rates = sorted(x["audio_s_per_s"] for x in r.rows.iterations() if x["audio_s_per_s"])
    got = C.cost(C.CostRequest("tiny", hours=1, epochs=1, devices=2, source=tiny_run, price_per_hour=1.0))
    assert (got["throughput"]["min"], got["throughput"]["median"], got["throughput"]["max"]) == (
        rates[0], statistics.median(rates), rates[-1])
    assert got["rows"][0]["usd"] == pytest.approx(1 / statistics.median(rates))  # 3,600 s / rate / 3,600 x $1
    with pytest.raises(C.CostError, match=f"run {tiny_run} trained preset 'tiny', not workload 'cpu'"):
        C.cost(C.CostRequest("cpu", hours=1, epochs=1, source=tiny_run))


@pytest.mark.parametrize("args, said", [
    (["nope", "--hours", "1", "--epochs", "1"], "workload 'nope' is not a preset"),
    (["fastconformer-l", "--hours", "-5", "--epochs", "1"], "--hours -5.0 must be a positive number of hours"),
    (["fastconformer-l", "--hours", "nan", "--epochs", "1"], "--hours nan must be a positive number of hours"),
    (["fastconformer-l", "--hours", "1"], "give one of --epochs and --steps"),
    (["fastconformer-l", "--hours", "1", "--epochs", "1", "--efficiency", "1.5"], "--efficiency 1.5 must be in (0, 1]"),
])
def test_bad_values_are_one_line_naming_them(args, said, capsys):
    assert main(["cost", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and said in err


def test_bad_files_are_one_line_naming_them(tmp_path, capsys):
    cases = {"garbage.json": "{not json", "dict.json": '{"workload": 1}', "rows.json": '[{"workload": "x"}]',
             "negative.json": json.dumps([{**_fixture_row(), "audio_s_per_s_median": -3}])}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        assert main(["cost", "fastconformer-l", "--hours", "1", "--epochs", "1", "--from", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(tmp_path / name) in err, err
    assert main(["cost", "fastconformer-xl", "--hours", "1", "--epochs", "1", "--from", str(FIXTURE)]) == 2
    assert "no measured one-device row of workload 'fastconformer-xl'" in capsys.readouterr().err
    assert main(["cost", "fastconformer-l", "--hours", "1", "--epochs", "1", "--from", str(tmp_path / "nowhere")]) == 2
    assert "nowhere: no such file or run folder" in capsys.readouterr().err
    assert main(["cost", "fastconformer-l", "--hours", "1", "--epochs", "1", "--from", str(tmp_path)]) == 2
    assert "neither a run folder nor a bench scale --json file" in capsys.readouterr().err


def test_measured_now_by_bench_scale_at_its_smallest_batch():
    small = ("model.layers=1", "model.d_model=64", "model.heads=2", "model.subsampling_channels=16")
    got = C.cost(C.CostRequest("fastconformer-l", hours=1, epochs=1, devices=2, overrides=small))
    t = got["throughput"]
    assert t["source"] == "measured now by bench scale: fastconformer-l, device cpu, fp32, 30 s batches, 3 steps"
    assert 0 < t["min"] <= t["median"] <= t["max"] and t["steps"] == 3
    assert got["rows"][0]["device_h"] == pytest.approx(1 / t["median"], rel=1e-12)  # 3,600 s / rate / 3,600
    price = got["assumptions"][4]
    assert price.startswith("no price: no price for ") and "dollars not computed" in price
    with pytest.raises(C.CostError, match="overrides model.layers=1 apply to a measurement made now, not to"):
        C.cost(C.CostRequest("fastconformer-l", hours=1, epochs=1, overrides=small[:1], source=FIXTURE))
