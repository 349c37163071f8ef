"""A recorded set of runs, written directly as run folders (format 2), each with its own results.db.

Five runs of known numbers: three seeds of one CPU-only configuration (one never reaches
CER 10), one on Sys1$ with four GPUs (NVML utilization, instant and averaged power, an
energy counter on gpu0 only) and a beam sweep, and one on a user platform rented by the
hour with RAPL package and DRAM counters. Every run logs a transcript containing HTML.
"""
import json

import pytest

from speechperf.results import ResultsDB

HOSTILE = "<b>bold</b> <script>alert(1)</script>"
EPOCH_S = 120.0  # TTA clock per epoch, its evaluation included (as the train loop counts it)
EVAL_S = 10.0  # evaluation time per epoch
EPOCHS = 6
CPU_ENV = {"cpu_model": "Test CPU 9000", "cpu_cores_logical": 2, "memory_gb": 24.0, "gpus": [],
           "libraries": {"torch": "2.13.0"}, "platform": None,
           "telemetry": {"gpus": 0, "rapl_zones": {}, "unavailable": {
               "gpu": "NVML unavailable (NVMLError_LibraryNotFound)", "rapl": "no RAPL zones under /sys/class/powercap"}}}
CLOUD_TOML = """[platform]
name = "cloud-a100"
devices = "1x A100 40 GB, 12 vCPU, 85 GB"
gpus = 1
usd_per_hour = 3.0
price_date = "2026-11-01"
"""
# validation CER per epoch; TTA to CER 10 (median of the last 3 epochs) in minutes: 8, 10, never, 6, 10
CERS = {"cpu-seed1": [30, 12, 9, 9, 9, 9], "cpu-seed2": [30, 20, 12, 9, 9, 9], "cpu-seed3": [30, 20, 15, 14, 13, 12],
        "sys1-gpu": [25, 9.5, 9.5, 9, 8, 7.5], "cloud-rapl": [40, 30, 20, 9, 9, 9]}


def _samples(name: str) -> list[tuple]:
    """(t, source, metric, value) rows as the sampler writes them, every 0.5 s."""
    rows = []
    for k in range(int(EPOCHS * (EPOCH_S + EVAL_S) * 2)):
        t = k * 0.5
        rows.append((t, "cpu", "util_pct", 150.0 + 30 * (k % 3)))
        if name == "sys1-gpu":
            for g in range(4):
                rows.append((t, f"gpu{g}", "util_pct", 60.0 + 10 * g))
                rows.append((t, f"gpu{g}", "mem_mb", 4000.0))
            rows.append((t, "gpu0", "power_w", 150.0))
            rows.append((t, "gpu1", "power_avg_w", 120.0))
            rows.append((t, "gpu0", "energy_j", 5000.0 + 150.0 * t))  # counter since driver load
        if name == "cloud-rapl" and k % 2 == 0:  # RAPL read every second, J since sampler start
            rows.append((t, "rapl:intel-rapl:0", "energy_j", 60.0 * t))
            rows.append((t, "rapl:intel-rapl:0:0", "energy_j", 10.0 * t))  # a sub-zone: inside the package's
    return rows


def write_run(root, name: str, seed: int, platform, env: dict, label: str | None = None):
    """One recorded run folder ``root/name`` with its own results.db; returns the folder."""
    run = root / name
    run.mkdir()
    with ResultsDB(run / "results.db") as db:
        _write_rows(db, run, name, seed, platform, env, label)
    return run


def _write_rows(db: ResultsDB, run, name: str, seed: int, platform, env: dict, label) -> None:
    run_id = f"{name}-0001"
    config = {"preset": "cpu" if name.startswith("cpu") else name, "train": {"seed": seed, "eval_split": "dev-clean"},
              "loader": {"batch_size": 8}}
    (run / "run.json").write_text(json.dumps({"format": 2, "run_id": run_id, "kind": "train", "label": label or name}))
    (run / "config.json").write_text(json.dumps(config))
    (run / "env.json").write_text(json.dumps(env))
    (run / "sentences.jsonl").write_text(
        json.dumps({"iteration": 50, "epoch": 1, "loss": 3.0, "pairs": [{"ref": "hello there", "hyp": "helo"}]}) + "\n"
        + json.dumps({"iteration": 100, "epoch": 2, "loss": 2.0, "pairs": [{"ref": HOSTILE, "hyp": "x"}]}) + "\n")
    db.upsert("runs", {"run_id": run_id, "kind": "train", "preset": config["preset"], "seed": seed, "platform": platform,
                       "out_dir": str(run), "config_json": config, "env_json": env, "started_at": 0.0, "status": "success"})
    its, evals = [], []
    for e in range(EPOCHS):
        for i in range(60):
            n = e * 60 + i
            its.append({"run_id": run_id, "iteration": n, "epoch": e + 1, "clock_s": e * EPOCH_S + i * (EPOCH_S - EVAL_S) / 60,
                        "loss": 300.0 / (1 + n) + (n % 5), "batch_size": 8, "frames": 8000, "audio_s": 80.0,
                        "step_s": 2.0, "utts_per_s": 4.0 + (i % 3), "audio_s_per_s": 40.0})
        evals.append({"run_id": run_id, "epoch": e + 1, "split": "dev-clean", "decoder": "wordbeam", "beam": 256,
                      "clock_s": (e + 1) * EPOCH_S, "eval_s": EVAL_S, "loss": 1.0, "wer": 2 * CERS[name][e],
                      "cer": CERS[name][e], "cer_paper": CERS[name][e] * 0.9, "n_utts": 20, "final": 0})
    for split in ("dev-clean", "dev-other", "test-clean", "test-other"):
        evals.append({"run_id": run_id, "epoch": EPOCHS, "split": split, "decoder": "wordbeam", "beam": 512,
                      "clock_s": EPOCHS * EPOCH_S, "eval_s": EVAL_S, "loss": 1.0, "wer": 18.0, "cer": 7.0,
                      "cer_paper": 6.5, "n_utts": 20, "final": 1})
    db.insert_many("iterations", its)
    db.insert_many("evals", evals)
    db.insert_many("samples", [{"run_id": run_id, "t": t, "source": s, "metric": m, "value": v}
                               for t, s, m, v in _samples(name)])
    if name == "sys1-gpu":
        db.insert_many("beam_sweep", [{"run_id": run_id, "split": "dev-clean", "decoder": "wordbeam", "beam": b,
                                       "eval_s": 2.0 * b, "wer": 25.0 - b / 1000, "cer": 9.3, "cer_paper": 9.0,
                                       "n_utts": 20, "device": "cpu"} for b in (64, 256, 1024)])


@pytest.fixture(scope="session")
def recorded_runs(tmp_path_factory):
    """{name: run folder} of the five recorded runs (labelled by their names)."""
    root = tmp_path_factory.mktemp("recorded")
    cloud = root / "cloud.toml"
    cloud.write_text(CLOUD_TOML)
    gpu_env = {**CPU_ENV, "platform": "sys1", "telemetry": {"gpus": 4, "rapl_zones": {}, "unavailable": {
        "rapl": "no RAPL zones under /sys/class/powercap", "gpu1:energy": "driver has no total-energy counter"}},
        "gpus": [{"index": g, "name": "GeForce RTX 2070", "memory_gb": 8.0} for g in range(4)]}
    rapl_env = {**CPU_ENV, "platform": str(cloud), "telemetry": {"gpus": 0, "unavailable": {"gpu": "NVML: no GPU"},
                "rapl_zones": {"rapl:intel-rapl:0": "package-0", "rapl:intel-rapl:0:0": "core"}}}
    for seed, name in enumerate(("cpu-seed1", "cpu-seed2", "cpu-seed3"), start=1):
        write_run(root, name, seed, None, CPU_ENV)
    write_run(root, "sys1-gpu", 1, "sys1", gpu_env)
    write_run(root, "cloud-rapl", 1, str(cloud), rapl_env)
    return {name: root / name for name in CERS}
