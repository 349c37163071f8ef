"""Speed of the seed aggregation behind ``speechperf tta`` and the report: 100 synthetic run
folders (20 groups of 5 seeds: 4 machines x 5 configurations of the ``tiny`` recipe, so every
run is checked against the shipped reference), timed in one process against the plain
per-run TTA table (the reference: what ``tta`` computed before it aggregated).

    python benchmarks/bench_aggregate.py [--runs 100]

Goal: the aggregates, intervals and reference checks over 100 runs under 2 s.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from speechperf.studies import rcp  # noqa: E402
from speechperf.studies.aggregate import aggregate  # noqa: E402
from speechperf.studies.study import seed_run, tta_study  # noqa: E402
from speechperf.scoring.targets import parse_targets  # noqa: E402
from speechperf.studies.study import targets_for  # noqa: E402
from speechperf.studies.tta import tta_table  # noqa: E402
from speechperf.results import ResultsDB  # noqa: E402

MACHINES = {"Xeon": 0.35, "EPYC": 0.5, "Graviton": 0.6, "Core": 0.3}  # minutes per epoch
TARGETS = "38,36,34"


def config_of(recipe: dict, seed: int, variant: int) -> dict:
    cfg: dict = {"preset": "tiny"}
    for key, value in recipe.items():
        section, _, name = key.partition(".")
        cfg.setdefault(section, {})[name] = value
    cfg["train"].update(seed=seed, threads=1 + variant)  # threads: not the recipe, so every variant is checked
    return cfg


def write_run(root: Path, name: str, cfg: dict, machine: str, per_epoch: float, cers: list[float], corpus: dict) -> Path:
    run = root / name
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"format": 2, "run_id": name, "label": f"{machine} tiny"}))
    (run / "config.json").write_text(json.dumps(cfg))
    (run / "env.json").write_text(json.dumps({"cpu_model": f"{machine} CPU", "cpu_cores_logical": 2}))
    (run / "events.log").write_text("".join(f':::MLLOG {{"key": "{k}", "value": {v}}}\n' for k, v in (
        ("train_samples", corpus.get("train_utterances")), ("eval_samples", corpus.get("eval_utterances")))))
    with ResultsDB(run / "results.db") as db:
        db.upsert("runs", {"run_id": name, "kind": "train", "seed": cfg["train"]["seed"], "config_json": cfg,
                           "status": "max_epochs"})
        for epoch, cer in enumerate(cers, 1):
            db.upsert("evals", {"run_id": name, "epoch": epoch, "split": "dev-clean", "decoder": "greedy", "beam": 1,
                                "clock_s": 60 * per_epoch * epoch, "eval_s": 0.5, "loss": 1.0, "wer": 2 * cer,
                                "cer": cer, "cer_paper": cer, "n_utts": 78, "final": 0})
    return run


def build(root: Path, n: int) -> list[Path]:
    ref = rcp.load_reference("tiny") or {"recipe": {"model.name": "ds2", "train.lr": 0.003}, "corpus": {}}
    corpus = ref["corpus"].get("fingerprint") or {}
    rng, runs = random.Random(0), []
    for k in range(n):
        machine = list(MACHINES)[k % 4]
        variant, seed = (k // 4) % 5, k // 20 + 1
        cers = [max(20.0, 48 - 2.2 * e + rng.uniform(-2, 2)) for e in range(1, 11)]
        runs.append(write_run(root, f"run{k:03d}", config_of(ref["recipe"], seed, variant), machine,
                              MACHINES[machine] * rng.uniform(0.97, 1.03), cers, corpus))
    return runs


def best(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=100)
    a = p.parse_args()
    t = time.perf_counter()
    import mlperf_logging.rcp_checker.rcp_checker  # noqa: F401  (their imports: scipy, pandas; once per process)
    import mlperf_logging.result_summarizer.result_summarizer  # noqa: F401
    imports = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as tmp:
        runs = build(Path(tmp), a.runs)
        spec = parse_targets(TARGETS)
        seeds = [seed_run(f"r{k}", json.loads((r / "config.json").read_text()),
                          json.loads((r / "env.json").read_text()), "max_epochs",
                          [{"clock_s": c, "cer": v} for c, v in _evals(r)], "cer", r) for k, r in enumerate(runs)]
        rcp.limits.cache_clear()
        cold = best(lambda: aggregate(seeds, targets_for(spec, "cer"), "cer", 3), repeat=1)
        warm = best(lambda: aggregate(seeds, targets_for(spec, "cer"), "cer", 3))
        plain = best(lambda: tta_table(runs, targets=spec))
        whole = best(lambda: tta_study(runs, targets=spec))
        _, groups, comparisons = aggregate(seeds, targets_for(spec, "cer"), "cer", 3)
    print(f"{a.runs} runs, {len(groups)} group rows, {len(comparisons)} comparisons; targets CER {TARGETS}")
    print(f"mlperf-logging imports (scipy, pandas; once per process): {imports:.2f} s")
    print(f"aggregation + intervals + reference checks: {cold:.3f} s first (mlperf-logging's RCP statistics computed), "
          f"{warm:.3f} s again (goal < 2 s)")
    print(f"plain per-run table (tta_table, the reference): {plain:.3f} s; tta with aggregation: {whole:.3f} s; "
          f"ratio {whole / plain:.2f}x; aggregation alone / plain table: {cold / plain:.2f}x")
    print(f"RCP check of the first group: {groups[0]['RCP check']}")


def _evals(run: Path) -> list[tuple[float, float]]:
    with ResultsDB(run / "results.db", readonly=True) as db:
        return [(r["clock_s"], r["cer"]) for r in db.query("SELECT clock_s, cer FROM evals ORDER BY epoch")]


if __name__ == "__main__":
    main()
