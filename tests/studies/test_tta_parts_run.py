"""A real tiny run through ``speechperf tta --json``: where its time to accuracy went adds up to
the TTA within 1% (its rows tile the clock), and recorded power samples show as its energy to
accuracy, a resumed run's two processes summed."""
import json
import math
import shutil

import pytest

from speechperf.studies import busy as busy_module
from speechperf.studies.time_parts import time_parts
from speechperf.results import ResultsDB
from speechperf.results.view import RunView
from speechperf.train import floor as train_floor
from tests.conftest import cli


@pytest.mark.timeout(600)
def test_the_parts_of_a_real_run_add_up_to_its_tta(tiny_run):
    r = RunView.open(tiny_run)
    try:
        iterations, evals, samples = r.rows.iterations(), r.rows.evals(), r.rows.samples()
    finally:
        r.close()
    assert all(i["data_s"] is not None and i["data_s"] >= 0 for i in iterations)
    segments = {s["segment"] for s in samples}  # one process; a new stretch after each evaluation's intervals
    assert samples and len(segments) >= 2 and None not in segments
    summary = json.loads((tiny_run / "summary.json").read_text())
    clock_s = 60 * summary["clock_min"]
    gc = summary["gc"]  # the interpreter's collections while the run trained (telemetry/gc_pauses.py)
    assert gc["collections"] >= gc["full collections"] >= 0 and gc["seconds"] >= gc["full seconds"] >= 0
    assert max(s["t"] for s in samples) <= clock_s + 0.5  # on the TTA clock, not the wall's
    assert sum(i["ckpt_s"] for i in iterations) > 0  # every 3 steps and at the epoch's end
    for e in evals:
        parts = time_parts(iterations, evals, e["clock_s"])
        assert parts["total s"] == pytest.approx(e["clock_s"], rel=0.01), parts
        assert parts["note"] is None and parts["steps s"] > 0 and parts["eval s"] > 0
    assert evals[-1]["clock_s"] - evals[0]["clock_s"] > 0

    p = cli("tta", tiny_run, "--metric", "ser", "--targets", "100", "--epochs", "1", "--json")  # SER <= 100: reached at once
    assert p.returncode == 0, p.stderr
    (row,) = json.loads(p.stdout)["runs"]
    assert row["time parts s"]["total s"] == pytest.approx(row["minutes"] * 60, rel=0.01)
    # the step against its floor, measured after training (train/floor.py): 3 steps asked, spread over the
    # epochs, as many as 5% of the run's clock allows (at least one)
    floor, windows = summary["floor"], min(3, train_floor.affordable(iterations, 1))
    assert floor["note"] is None and floor["asked"] == 3 and floor["steps"] == floor["windows"] == windows
    assert floor["epochs"] == len({w[1]["epoch"] for w in train_floor.pick_windows(iterations, windows, 1)})
    assert floor["loop_over_floor_p10"] <= floor["loop_over_floor"] <= floor["loop_over_floor_p90"]
    assert all(math.isfinite(floor[k]) and floor[k] > 0 for k in ("loop_over_floor", "run_over_floor", "floor_tflops"))
    assert floor["replay_s"] > 0 and floor["clock_s"] == pytest.approx(iterations[-1]["clock_s"])
    assert row["step floor"] == floor and row["step vs floor"].startswith("loop/floor ")
    # whether it shared its machine: the others' share sampled every second (telemetry/contention.py)
    others = [s for s in samples if s["metric"] == "others_pct"]
    assert len(others) >= int(clock_s) - 1 and row["shared machine"]["samples"] <= len(others)
    assert row["shared"] in ("no", f"yes {row['shared machine']['contended %']:.0f}%")
    assert summary["shared"]["samples"] == len(others) and summary["shared"]["threads"] == 1
    assert row["time parts"].endswith(f"; loop/floor {floor['loop_over_floor']:.2f}")
    assert row["time parts"].startswith("steps ")
    # its evaluations' decodes, as the run recorded them: threads, frames, thread-seconds and their CPU share
    dec, first = row["decode"], evals[0]
    assert dec["threads"] == first["decode_threads"] >= 1 and dec["frames"] == first["decode_frames"] > 0
    assert 0 < first["decode_cpu_s"] <= first["decode_busy_s"] * 1.05 and 0 < dec["core share %"] <= 105
    # a CPU run: its recorded CPU utilization is its busy share, in the training phases and evaluations too
    busy = row["busy"]
    assert (busy["device"], busy["metric"], busy["sources"]) == ("CPU", "util_machine_pct", ["cpu"])
    # the tiny run's first evaluation takes tens of milliseconds, about the sampler's period: it holds
    # a sample or none, counted here from the rows themselves
    cpu = [s["t"] for s in samples if s["metric"] == "util_machine_pct"]
    in_eval = sum(first["clock_s"] - first["eval_s"] < t <= first["clock_s"] + busy_module.EPS for t in cpu)
    assert busy["eval samples"] == in_eval and busy["training samples"] > 0
    assert busy["tta samples"] >= busy["training samples"] + in_eval
    assert all(0 < busy[f"{p} %"] <= 100 for p in ("tta", "training"))
    assert (busy["eval %"] is None) == (in_eval == 0) and (in_eval == 0 or 0 < busy["eval %"] <= 100)
    eval_pct = "NA" if busy["eval %"] is None else f"{busy['eval %']:.0f}%"
    assert row["time parts"].endswith(f"CPU busy {busy['tta %']:.0f}% (training {busy['training %']:.0f}% eval "
                                      f"{eval_pct}; {busy['tta samples']} samples); loop/floor "
                                      f"{floor['loop_over_floor']:.2f}")
    # no power source on this machine: no energy, and the note says why
    assert row["energy to accuracy kWh"] is None and "no energy counter or power samples (" in row["price note"]


@pytest.mark.timeout(600)
def test_tta_json_shows_the_energy_of_a_run_with_samples(tiny_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(tiny_run, copy)
    r = RunView.open(copy)
    run_id, tta_s = r.run_id, r.rows.evals()[0]["clock_s"]
    r.close()
    half = tta_s / 2
    # NVML's counter from two processes (a resume at half the TTA; it counted 50 kJ while the run was down),
    # 100 W throughout; and samples after the TTA, not charged
    rows = [{"run_id": run_id, "t": t, "source": "gpu0", "metric": "energy_j", "value": v, "segment": seg}
            for seg, pts in ((1.0, [(0.0, 1000.0), (half, 1000.0 + 100 * half)]),
                             (2.0, [(half, 51000.0 + 100 * half), (tta_s, 51000.0 + 100 * tta_s),
                                    (tta_s + 10, 51000.0 + 100 * (tta_s + 10))]))
            for t, v in pts]
    rows += [{"run_id": run_id, "t": t, "source": "gpu0", "metric": "util_pct", "value": v, "segment": 2.0}
             for t, v in ((half, 60.0), (tta_s + 10, 100.0))]
    with ResultsDB(copy / "results.db") as db:
        db.insert_many("samples", rows)
    p = cli("tta", copy, "--metric", "ser", "--targets", "100", "--epochs", "1", "--json")
    assert p.returncode == 0, p.stderr
    (row,) = json.loads(p.stdout)["runs"]
    assert row["energy to accuracy kWh"] == pytest.approx(100 * tta_s / 3.6e6)
    # a CPU run on a machine whose GPU the sampler saw (idle): its busy share stays the CPU's
    assert (row["busy"]["device"], row["busy"]["metric"]) == ("CPU", "util_machine_pct")
    assert "no energy" not in (row["price note"] or "")


def test_samples_taken_off_the_clock_are_dropped_and_later_ones_moved_back():
    from speechperf.telemetry.sample import Sample
    from speechperf.train.machine_record import MachineRecord

    rec = MachineRecord(rows=None, run_id="r")
    rec.p0, rec.t0, rec.segment, rec.off_spans = 100.0, 5.0, 1.0, [(102.0, 104.0, 2.0), (106.0, 107.0, 3.0)]
    rows = [rec.on_clock(Sample(t, "gpu0", "energy_j", v)) for t, v in
            ((1.0, 10.0), (3.0, 30.0), (5.0, 50.0), (6.5, 65.0), (8.0, 80.0))]
    assert [(r["t"], r["segment"]) if r else None for r in rows] == [(6.0, 1.0), None, (8.0, 2.0), None, (10.0, 3.0)]
