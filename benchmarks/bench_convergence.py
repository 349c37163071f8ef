"""Reference convergence points of a preset: train it with several seeds, print epochs and
minutes to its target per seed and the aggregate, and (``--write``) store them as the
preset's reference in ``speechperf/config/rcp/PRESET.json`` (speechperf/studies/rcp.py).

    python benchmarks/run.py convergence tiny --seeds 5 --target 38 --set train.stop.max_epochs=10 \\
        --threads 1 --data FEATS --write
    python benchmarks/run.py convergence cpu --seeds 6-10 --isa avx2 --data FEATS --write   # a later batch
    python benchmarks/run.py convergence cpu --seeds 3 --threads 1 --past-target --data FEATS  # and the floor
    python benchmarks/run.py convergence cpu --seeds 5 --curves 2 --data FEATS --write  # the reference curves

The ratio: the slowest seed's TTA over the fastest's (docs/convergence.md: max/min <= 1.3), both
trained in the same call.

``--curves N`` trains each seed's first N epochs under the whole AVX2 cap (ONEDNN_MAX_CPU_ISA
and ATEN_CPU_CAPABILITY, hardware/isa_cap.py) at 1 thread, as ``speechperf reproduce`` does
(train.stop.after_epochs: the schedule is the reference's), and ``--write`` stores each
seed's per-epoch validation loss, CER and WER (full precision, from the run's results.db)
with its settings as a curve of that seed (one per features folder: its checksum,
features/checksum.py); the seeds' epochs to target stay as they are.

Resumable: each seed trains into OUT/seed-S (``train --resume auto``: a finished seed is
only read again, an interrupted one continues), and ``--write`` merges the seeds measured
into the reference file (a seed measured again replaces its entry), so batches of seeds can
be measured and committed separately. Each seed records how, when and where it was
measured: commit, machine, ISA, threads, torch version. A batch of another recipe, metric
or corpus than the file's is refused (start a new file by deleting it).
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

from _curves import REPO, commit, measure_curves, synth_params  # the curves' half; its helpers shared
from speechperf.atomic import atomic_write_text
from speechperf.config import load_preset
from speechperf.errors import SpeechperfError
from speechperf.studies import rcp
from speechperf.studies.precisions import precision
from speechperf.scoring.olympic import olympic_mean
from speechperf.scoring.target_rule import epochs_to_target
from speechperf.results.formats import read_json
from speechperf.results.view import RunView
from speechperf.tables import emit
from speechperf.drive.seeds import parse_seeds, seed_folder  # the layout of train --seeds
from speechperf.hardware.machine import hardware
from speechperf.hardware.isa_cap import ATEN_VAR, CAPS, ONEDNN_VAR, cap_env

GOAL = ("docs/convergence.md: a preset's seeds reach its target with margin; the TTA spread over seeds "
        "max/min <= 1.3")
REFERENCE = "the fastest seed's TTA, trained in the same call"
RATIO = "max / min minutes to target over the seeds"
DATA = True


def child_env(isa: str | None) -> dict:
    """The training's environment: this tree on the path, capped to ``isa`` (both variables)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return cap_env(isa, env)


def cpu_capability(env: dict) -> str:
    """The ISA torch's CPU kernels use under ``env`` (the cap applied)."""
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()


def train(a, seed: int, out: Path, env: dict) -> None:
    stop_at = 0 if a.past_target else a.target  # 0: the whole schedule; the target is declared from the evals after
    cmd = [sys.executable, "-m", "speechperf", "train", "--preset", a.preset, "--data", str(a.data), "--out", str(out),
           "--json", f"train.seed={seed}", f"train.stop.target={stop_at}", *a.set]
    if a.threads:
        cmd.append(f"train.system.threads={a.threads}")
    print(f"seed {seed}: {' '.join(cmd[3:])}", flush=True)
    stamp = out / "bench_convergence.json"  # the commit and date the seed was trained at (a resumed batch keeps them)
    if not stamp.is_file():
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(stamp, json.dumps({"commit": commit(), "date": datetime.date.today().isoformat()}))
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL)
    if done.returncode not in (0, 1):  # 1: a diverged run, which is a result (it never reached the target)
        sys.exit(f"seed {seed}: train exited {done.returncode}")
    status = read_json(out / "summary.json").get("status", "") if (out / "summary.json").is_file() else ""
    if done.returncode == 1 and not status.startswith("diverged"):  # a crash is no convergence point: never recorded as one
        sys.exit(f"seed {seed}: train failed ({status or 'no summary.json'}) in {out}; the same command continues it")


def measured(a, seed: int, out: Path, isa: str) -> tuple[dict, dict, dict]:
    """(the seed's reference entry, the run's config, its corpus fingerprint)."""
    run = RunView.open(out)
    try:
        config, env, status = run.config, run.env, run.rows.row().get("status")
        evals = [(e["clock_s"], e[a.metric]) for e in run.rows.evals()]
    finally:
        run.close()
    stamp = out / "bench_convergence.json"
    when = json.loads(stamp.read_text()) if stamp.is_file() else {"commit": commit(), "date": datetime.date.today().isoformat()}
    window = config["train"]["stop"]["target_epochs"]
    epochs = epochs_to_target(evals, a.target, window)
    # the issue-22 margin: how far under the target the median of the window was at the epoch
    # the target was declared (a recipe that crosses by 0.1 turns float noise into a verdict)
    margin = a.target - statistics.median(v for _, v in evals[epochs - window: epochs]) if epochs else None
    # and at the last epoch trained (--past-target: the schedule's end, the recipe's floor; a
    # run stopped at the target: the same as at the declaration)
    at_end = a.target - statistics.median(v for _, v in evals[-window:]) if len(evals) >= window else None
    entry = {"seed": seed, "status": status, "epochs": {rcp._key(a.target): epochs}, "margin": {rcp._key(a.target): margin},
             "margin_at_end": {rcp._key(a.target): at_end},
             "minutes": {rcp._key(a.target): evals[epochs - 1][0] / 60 if epochs else None},
             f"final_{a.metric}": evals[-1][1] if evals else None, "epochs_trained": len(evals),
             "measured": {**when, "host": platform.node(),
                          "machine": hardware(env), "isa": isa, "onednn_max_cpu_isa": CAPS.get(a.isa, {}).get(ONEDNN_VAR),
                          "aten_cpu_capability": CAPS.get(a.isa, {}).get(ATEN_VAR),
                          "threads": config["train"]["system"].get("threads"), "torch": env.get("libraries", {}).get("torch")}}
    return entry, config, rcp.corpus_of(out / "events.log")


def summary(a, entries: list[dict]) -> list[dict]:
    key = rcp._key(a.target)
    minutes = [e["minutes"][key] for e in entries if e["minutes"].get(key) is not None]
    failed = len(entries) - len(minutes)
    score, rule = olympic_mean(minutes, failed)
    margins = [e.get("margin", {}).get(key) for e in entries]
    return [{"seeds": len(entries), "reached": len(minutes),
             "reached with margin >= 0.5": sum(1 for m in margins if m is not None and m >= 0.5),
             "margin at end >= 0.5": sum(1 for e in entries if (e.get("margin_at_end", {}).get(key) or 0) >= 0.5),
             "median TTA min": statistics.median(minutes) if minutes else None,
             "olympic TTA min": score, "min TTA min": min(minutes, default=None), "max TTA min": max(minutes, default=None),
             "max/min": max(minutes) / min(minutes) if minutes else None, "olympic rule": rule}]


def write(a, entries: list[dict], config: dict, corpus: dict) -> Path:
    """Merge ``entries`` into the preset's reference file (same recipe, metric, window, corpus)."""
    path = rcp.reference_path(a.preset, precision(config))  # a bf16 batch: PRESET.bf16.json
    new = {"format": rcp.FORMAT, "preset": a.preset, "metric": a.metric, "window": config["train"]["stop"]["target_epochs"],
           "targets": [a.target], "recipe": rcp.recipe(config), "overrides": a.set,
           "corpus": {"fingerprint": corpus, "data": str(a.data), **synth_params(a.data)}, "how": "benchmarks/run.py convergence", "seeds": []}
    old = json.loads(path.read_text()) if path.is_file() else new
    old["corpus"].update({k: v for k, v in new["corpus"].items() if k not in old["corpus"]})
    for field in ("metric", "window", "recipe"):
        if old[field] != new[field]:
            sys.exit(f"{path}: its {field} differs from this batch's ({old[field]!r} vs {new[field]!r}); delete it to start over")
    if old["corpus"]["fingerprint"] != corpus:
        sys.exit(f"{path}: measured on another corpus ({old['corpus']['fingerprint']} vs {corpus})")
    mine = {e["seed"] for e in entries}
    curves = {s["seed"]: s["curves"] for s in old["seeds"] if s.get("curves")}  # --curves' (a seed's first epochs) stay
    entries = [{**e, "curves": curves[e["seed"]]} if e["seed"] in curves else e for e in entries]
    old["seeds"] = sorted([s for s in old["seeds"] if s["seed"] not in mine] + entries, key=lambda s: s["seed"])
    old["targets"] = sorted(set(old["targets"]) | {a.target}, reverse=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(old, indent=1) + "\n")
    return path


def arguments(p) -> None:
    p.add_argument("preset", nargs="?", default="tiny")
    p.add_argument("--seeds", default="2", help="N (seeds 1..N), A-B, or a comma list")
    p.add_argument("--out", type=Path, default=None, help="run folders (default bench-convergence/PRESET)")
    p.add_argument("--target", type=float, default=None, help="error %% to reach (default: the preset's train.stop.target)")
    p.add_argument("--metric", default="cer", choices=["cer", "wer"])
    p.add_argument("--isa", choices=sorted(CAPS), default=None,
                   help="cap the ISA of oneDNN and of torch's own kernels (ONEDNN_MAX_CPU_ISA and ATEN_CPU_CAPABILITY)")
    p.add_argument("--curves", type=int, default=0, metavar="N",
                   help="train each seed's first N epochs under the avx2 cap at 1 thread and (--write) store its curve")
    p.add_argument("--threads", type=int, default=0, help="train.system.threads (0: the preset's)")
    p.add_argument("--set", nargs="*", default=[], help="config overrides k=v, recorded in the reference")
    p.add_argument("--past-target", action="store_true",
                   help="train the whole schedule (train.stop.target=0; not a recipe field) and declare the target from "
                        "the evaluations: the margin at the end is the recipe's floor under the target")
    p.add_argument("--write", action="store_true", help="merge the seeds into speechperf/config/rcp/PRESET.json")


def run(a) -> dict:
    if a.curves:  # the first epochs of reference seeds: no target, no ratio
        measure_curves(a, a.out or Path("bench-convergence") / a.preset, child_env("avx2"))
        return {"preset": a.preset, "curves": a.curves, "seeds": a.seeds, "ratio": None}
    cfg = load_preset(a.preset, a.set)
    a.target = a.target or cfg.train.stop.target
    if not a.target:
        raise SpeechperfError(f"preset {a.preset!r} names no train.stop.target: give --target")
    out = a.out or Path("bench-convergence") / a.preset
    env = child_env(a.isa)
    isa = cpu_capability(env)
    entries, config, corpus = [], None, None
    for seed in parse_seeds(a.seeds):
        folder = seed_folder(out, seed)
        train(a, seed, folder, env)
        entry, config, corpus = measured(a, seed, folder, isa)
        entries.append(entry)
    key = rcp._key(a.target)
    emit([{"seed": e["seed"], "status": e["status"], "epochs to target": e["epochs"][key],
           "minutes to target": e["minutes"][key], "margin at target": e.get("margin", {}).get(key),
           "margin at end": e.get("margin_at_end", {}).get(key),
           f"final {a.metric}": e[f"final_{a.metric}"],
           "epochs trained": e["epochs_trained"]} for e in entries], False)
    total = summary(a, entries)
    emit(total, False)
    if a.write:
        print(f"wrote {write(a, entries, config, corpus)}")
    return {"preset": a.preset, "target": a.target, "seeds": {e["seed"]: {"epochs": e["epochs"][key],
            "minutes": e["minutes"][key], "margin": e.get("margin", {}).get(key)} for e in entries},
            **{k: v for k, v in total[0].items() if k != "olympic rule"}, "ratio": total[0]["max/min"]}
