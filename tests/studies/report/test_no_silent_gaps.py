"""A report of runs that hold every kind of row says "Not measured" / "Not shown" nowhere.

The runs are written through ``Run`` (the folder's files and its own results.db, with the
schema of results/schema.py) as training, the sampler, the beam sweep, ``bench ops``,
``bench zoo`` and a parallel sweep write them. Whatever section then says it has nothing to
show reads the wrong rows (a renamed metric, a renamed column): the report must never say
"not measured" beside data the run holds.
"""
import csv
import json
import re

import pytest

from speechperf.studies.report.html import build_report
from speechperf.results.run import Run

# Every metric the sampler writes (telemetry/sampler.py), per source: CPU utilization in two
# units, a GPU's utilization, memory, instant and driver-averaged power, energy counters.
SAMPLES = {"cpu": ("util_machine_pct", "util_core_pct"), "gpu0": ("util_pct", "mem_mb", "power_w", "energy_j"),
           "gpu1": ("util_pct", "mem_mb", "power_avg_w"), "rapl:intel-rapl:0": ("energy_j",)}
GPU_ENV = {"cpu_model": "AMD EPYC 9454 48-Core Processor", "cpu_cores_logical": 96, "device": "cuda:0", "world_size": 2,
           "platform": "sys1", "hostname": "box", "cuda": "12.4", "libraries": {"torch": "2.13.0"},
           "gpus": [{"index": g, "name": "GeForce RTX 2070", "memory_gb": 8.0, "driver": "550.54"} for g in range(2)],
           "telemetry": {"gpus": 2, "rapl_zones": {"rapl:intel-rapl:0": "package-0"}, "unavailable": {}}}
EPOCHS, EPOCH_S = 4, 60.0
NA_WORDS = ("Not measured", "Not shown", "class=na")  # html.py's wordings for a block with nothing to show


def _value(metric: str, t: float) -> float:
    return {"util_machine_pct": 40.0, "util_core_pct": 3840.0, "util_pct": 80.0, "mem_mb": 4000.0, "power_w": 150.0,
            "power_avg_w": 120.0}.get(metric, 100.0 * t)  # energy_j: a counter of 100 W


def _training_run(root, name: str, seed: int):
    config = {"preset": "full", "model": {"name": "ds2", "conv_channels": 8, "lstm_layers": 1, "lstm_hidden": 8},
              "train": {"seed": seed, "eval_split": "dev-clean", "precision": "fp32"}}
    with Run.create(root / name, kind="train", config=config, env=GPU_ENV, label=name) as run:
        for n in range(EPOCHS * 20):  # each epoch: 20 steps of 2.5 s from its start, 5 s to the evaluation's
            epoch, k = n // 20 + 1, n % 20  # 5 s: the TTA clock tiled (studies/time_parts.py)
            run.rows.add_iteration({"iteration": n, "epoch": epoch, "clock_s": (epoch - 1) * EPOCH_S + 2.5 * (k + 1),
                               "loss": 100.0 / (n + 1), "batch_size": 8, "frames": 800, "audio_s": 8.0, "step_s": 2.5,
                               "utts_per_s": 8.0, "audio_s_per_s": 8.0, "data_s": 0.5, "ckpt_s": 0.25 if k == 10 else 0.0})
        run.rows.flush()
        run.rows.insert("evals", [{"run_id": run.run_id, "epoch": e, "split": "dev-clean", "decoder": "greedy", "beam": 1,
                              "clock_s": e * EPOCH_S, "eval_s": 5.0, "eval_forward_s": 2.0, "eval_decode_s": 2.5,
                              "eval_score_s": 0.5, "loss": 1.0, "wer": 30.0 - 4 * e, "cer": 12.0 - e,
                              "cer_paper": 11.0 - e, "n_utts": 10, "final": 0, "cer_lo": 10.5 - e, "cer_hi": 13.5 - e,
                              "wer_lo": 27.0 - 4 * e, "wer_hi": 33.0 - 4 * e, "ser": 90.0 - 10 * e,
                              "ser_lo": 80.0 - 10 * e, "ser_hi": 100.0 - 10 * e, "decode_threads": 4,
                              "decode_frames": 8000, "decode_busy_s": 2.0, "decode_cpu_s": 1.5}
                             for e in range(1, EPOCHS + 1)]
                   + [{"run_id": run.run_id, "epoch": EPOCHS, "split": split, "decoder": "wordbeam", "beam": 256,
                       "clock_s": EPOCHS * EPOCH_S, "eval_s": 5.0, "eval_forward_s": 2.0, "eval_decode_s": 2.5,
                       "eval_score_s": 0.5, "loss": 1.0, "wer": 15.0, "cer": 7.0,
                       "cer_paper": 6.5, "n_utts": 10, "final": 1, "cer_lo": 6.0, "cer_hi": 8.0, "wer_lo": 13.0,
                       "wer_hi": 17.0, "ser": 40.0, "ser_lo": 30.0, "ser_hi": 50.0,
                       **dict.fromkeys(("decode_threads", "decode_frames", "decode_busy_s", "decode_cpu_s"))}
                      for split in ("dev-clean", "test-clean")])
        run.rows.insert("samples", [{"run_id": run.run_id, "t": k * 0.5, "source": source, "metric": metric,
                                "value": _value(metric, k * 0.5)}
                               for k in range(int(EPOCHS * EPOCH_S * 2)) for source, metrics in SAMPLES.items()
                               for metric in metrics])
        run.rows.insert("beam_sweep", [{"run_id": run.run_id, "split": "dev-clean", "decoder": "wordbeam", "beam": b,
                                   "eval_s": b / 10, "wer": 16.0, "cer": 7.5, "cer_paper": 7.0, "n_utts": 10,
                                   "device": "cpu"} for b in (16, 64)])
        run.log.append_sentences({"iteration": 20, "epoch": 1, "loss": 3.0, "pairs": [{"ref": "a cat", "hyp": "a cap"}]})
        run.rows.set_status("success")
        run.write_summary({"status": "success", "init_s": 3.0})
    return root / name


def _bench_and_parallel_rows(run_folder) -> None:
    """bench ops at two thread counts, a zoo sweep and a parallel sweep, in the first run's database."""
    with Run.open(run_folder) as run:
        run.rows.insert("bench_ops", [{"at": 1.0, "device": "cpu", "dtype": "fp32", "threads": t, "op": "matmul",
                                  "shape": "512x512x512", "iters": 10, "ms_mid": 1.0, "spread_pct": 1.0,
                                  "tflops": 0.1 * t, "pct_peak": 40.0 * t, "peak_source": "datasheet", "status": "ok"}
                                 for t in (1, 2)])
        run.rows.insert("bench_zoo", [{"at": 1.0, "model": "ds2", "batch": b, "precision": "fp32", "device": "cpu",
                                  "params_m": 1.0, "paper_params_m": 1.0, "unit": "utterances", "samples_per_s": 10.0 * b,
                                  "power_w": 50.0, "joules_per_sample": 5.0 / b, "energy": "RAPL", "status": "ok"}
                                 for b in (4, 8)])


@pytest.fixture(scope="module")
def full_page(tmp_path_factory):
    root = tmp_path_factory.mktemp("full")
    runs = [_training_run(root, f"seed{s}", s) for s in (1, 2)]  # two seeds: the repeated-runs table has a group
    _bench_and_parallel_rows(runs[0])
    index = build_report(runs, root / "report", costs=[_cost_file(root)])
    return index


def _cost_file(root):
    """A `speechperf cost --json` output (a training's cost at 1..8 devices, priced, with power)."""
    from speechperf.studies import cost

    t = cost.Throughput((40.0, 50.0, 80.0), 3, 300.0, "hand", power_w=300.0, power_note="300 W measured")
    got = cost.cost(cost.CostRequest("fastconformer-l", hours=100, epochs=1, devices=8, price_per_hour=2.0), t)
    path = root / "cost.json"
    path.write_text(json.dumps(got))
    return path


def test_no_section_says_not_measured_beside_data_the_runs_hold(full_page):
    page = full_page.read_text()
    gaps = [m.group(0) for m in re.finditer(r"<p class=na>.*?</p>", page)]
    assert gaps == [], gaps
    for word in NA_WORDS:
        assert word not in page, word


def _csv(page, name):
    with open(page.parent / name, newline="") as f:
        return list(csv.DictReader(f))


def test_cells_the_runs_hold_are_filled(full_page):
    """Beyond whole blocks: the cells computed from the runs' rows are not left empty."""
    for r in _csv(full_page, "price.csv"):
        if r["run"].startswith("seed"):
            assert r["TTA min"] == "3.0" and float(r["energy to accuracy kWh"]) > 0 and r["workload"], r
    # where the time went up to CER 10 (epoch 3, 180 s): 3 epochs of 20 steps, 5 s between steps and evaluation
    for r in _csv(full_page, "time_parts.csv"):
        parts = {k: float(r[f"{k} s"]) for k in ("steps", "data", "eval", "checkpoints", "epoch changes",
                                                 "eval forward", "eval decode", "eval score", "total", "until")}
        assert parts == pytest.approx({"steps": 119.25, "data": 30.0, "eval": 15.0, "checkpoints": 0.75,
                                       "epoch changes": 15.0, "eval forward": 6.0, "eval decode": 7.5,
                                       "eval score": 1.5, "total": 180.0, "until": 180.0}), r
        assert r["to"] == "CER 10" and r["note"] == "" and r["shares"].startswith("steps 66% data 17% eval 8%"), r
        # both GPUs at 80% every 0.5 s: 2 x 360 samples in (0, 180], 2 x 3 x 20 in the evaluations' 5 s windows (0.5 s
        # apart: 10 each), the rest of each epoch's first step (at 0 s) to its evaluation (at 55 s) in training
        busy = {k: r[f"busy {k}"] for k in ("device", "tta %", "tta samples", "training samples", "eval samples")}
        assert busy == {"device": "GPU", "tta %": "80.0", "tta samples": "720", "training samples": "660",
                        "eval samples": "60"}, r
        assert r["busy"] == "GPU busy 80% (training 80% eval 80%; 720 samples)"
        assert r["busy note"] == "averaged over gpu0, gpu1: the GPUs the sampler read"
        # the per-epoch evaluations' decodes (the final ones recorded none): 3 x 8000 frames in 3 x 2 thread-seconds
        assert (r["decode threads"], r["decode frames per thread-s"], r["decode core share %"]) == ("4", "4000.0", "75.0")
    energy = {(r["run"].split()[0], r["source"]): r["method"] for r in _csv(full_page, "energy.csv")}
    assert energy == {(f"seed{s}", src): how for s in (1, 2) for src, how in
                      (("gpu0", "counter"), ("gpu1", "integrated-power"), ("rapl:intel-rapl:0", "counter"))}
    assert all(r["workload"].startswith("ds2, ") for name in ("tta.csv", "runs.csv", "throughput.csv")
               for r in _csv(full_page, name))
    validation = [(r["run"], r["epoch"], r["CER %"], r["CER 95% low"], r["CER 95% high"], r["WER 95% low"],
                   r["WER 95% high"]) for r in _csv(full_page, "validation.csv")]
    assert validation[:2] == [("seed1", "1", "11.0", "9.5", "12.5", "23.0", "29.0"),
                              ("seed1", "2", "10.0", "8.5", "11.5", "19.0", "25.0")]
    assert len(validation) == 2 * EPOCHS
    ser = [(r["SER %"], r["SER 95% low"], r["SER 95% high"]) for r in _csv(full_page, "validation.csv")]
    assert ser[:2] == [("80.0", "70.0", "90.0"), ("70.0", "60.0", "80.0")]
    assert {r["SER %"] for r in _csv(full_page, "final.csv")} == {"40.0"}


def test_utilization_table_has_every_utilization_series(full_page):
    rows = _csv(full_page, "utilization.csv")
    series = {(r["run"].split(" ")[0], r["source"], r["metric"]): r for r in rows}
    assert {(s, m) for _, s, m in series} == {("cpu", "util_machine_pct"), ("cpu", "util_core_pct"),
                                             ("gpu0", "util_pct"), ("gpu1", "util_pct")}
    cpu = series[("seed1", "cpu", "util_machine_pct")]
    assert (float(cpu["mean %"]), cpu["unit"], int(cpu["samples"])) == (40.0, "% of the machine", EPOCHS * EPOCH_S * 2)
    assert series[("seed1", "cpu", "util_core_pct")]["unit"] == "% of one core"
    assert series[("seed1", "gpu0", "util_pct")]["unit"] == "% of the GPU"
