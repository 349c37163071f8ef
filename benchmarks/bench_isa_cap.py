"""The effect of the ISA cap on the machine at hand: the same seed trained for N epochs at 1
thread without the cap (the machine's own kernels) and under the whole AVX2 cap
(ONEDNN_MAX_CPU_ISA=AVX2, ATEN_CPU_CAPABILITY=avx2 and MKL_CBWR=COMPATIBLE,
telemetry/isa_cap.py), each in its own child process; prints both curves (validation loss,
CER, WER per epoch, full precision), the kernels each ran (env.json's "isa"), whether the
curves are identical, and the cap's cost in training seconds per epoch (capped / uncapped,
the uncapped run the named reference).

On an AVX2 machine the two runs use the same kernels (torch's capability is AVX2 either way)
and the curves are identical; on an AVX-512 machine they differ from the first epoch, and the
capped one is the curve an AVX2 machine trains (issue 31).

    python benchmarks/bench_isa_cap.py tiny --data FEATS --epochs 2 --seed 1
    python benchmarks/bench_isa_cap.py --prepare CORPUS [--repeat 2]

``--prepare CORPUS``: the features' side instead. (1) ``speechperf prepare CORPUS`` at 1
worker without and under the cap, interleaved, CPU seconds of the process tree each
(uncapped: the reference), with the features checksum of each (equal: the features do not
depend on the cap); (2) in one process, extract_batch over CORPUS's audio in float32 and in
float64 (features/extract.py's arithmetic), interleaved, CPU seconds (float32: the reference).
Goal: prepare under the cap costs at most 10% more than without.

``--step PRESET``: one training step of PRESET's model (forward and backward of a random
batch of 24 x 6 s, 1 thread) timed in CPU seconds in child processes without and under the
cap, interleaved (uncapped: the reference): MKL's vendor-independent path is the cap's cost
on the matrix products.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from speechperf.studies import curve, rcp  # noqa: E402
from speechperf.results.view import RunView  # noqa: E402
from speechperf.tables import emit  # noqa: E402
from speechperf.telemetry.isa_cap import ATEN_VAR, CAP_VARS, MKL_VAR, ONEDNN_VAR, cap_env  # noqa: E402
from speechperf.drive.reproduce import child_command  # noqa: E402


def train(a, isa: str | None, folder: Path) -> dict:
    """One run of ``a.preset`` seed ``a.seed`` under ``isa`` (None: neither variable set)."""
    base = {k: v for k, v in os.environ.items() if k not in CAP_VARS}
    base["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    ref = rcp.load_reference(a.preset) or {}
    cmd = child_command(a.preset, a.data, a.seed, a.epochs, folder, ref.get("overrides", []))
    done = subprocess.run(cmd, env=cap_env(isa, base), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"{isa or 'no cap'}: train exited {done.returncode}: {done.stderr[-1500:]}")
    with RunView.open(folder) as run:
        evals, env, iters = run.rows.evals(), run.env, run.rows.iterations()
    return {"curve": curve.curve_of(evals), "isa": env.get("isa", {}),
            "train s/epoch": sum(r.get("step_s") or 0.0 for r in iters) / max(len(evals), 1)}


def prepare_cpu_s(corpus: Path, isa: str | None, out: Path) -> tuple[float, str]:
    """(CPU seconds of ``speechperf prepare CORPUS OUT --workers 1`` and its children, the
    features checksum) under ``isa``."""
    import resource

    from speechperf.features.checksum import features_sha256

    base = {k: v for k, v in os.environ.items() if k not in CAP_VARS}
    base["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "speechperf", "prepare", str(corpus), str(out), "--workers", "1", "--json"],
                   env=cap_env(isa, base), stdout=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, features_sha256(out)


def extract_cpu_s(corpus: Path, repeat: int) -> dict:
    """{dtype name: CPU seconds of extract_batch over every utterance of ``corpus``}, interleaved."""
    import time

    import torch

    from speechperf.corpus.librispeech import find_splits, iter_split, read_audio
    from speechperf.features.extract import extract_batch

    torch.set_num_threads(1)
    waves = [read_audio(u.audio_path) for s in find_splits(corpus) for u in iter_split(corpus, s, [])]
    out = {"float32": 0.0, "float64": 0.0}
    for _ in range(repeat):
        for name in out:
            t = time.process_time()
            extract_batch(waves, dtype=getattr(torch, name))
            out[name] += time.process_time() - t
    return out


STEP = """
import sys, time, torch
from speechperf.config import load_preset
from speechperf.models import build_model
torch.set_num_threads(1); torch.manual_seed(0)
cfg = load_preset(sys.argv[1])
model = build_model(cfg.model)
x, lengths = torch.randn(24, 600, getattr(cfg.model, "input_dim", 93)), torch.full((24,), 600)
def step():
    out = model(x, lengths)[0]
    out.sum().backward()
step()  # warm-up: allocations, oneDNN's primitives
t = time.process_time()
for _ in range(int(sys.argv[2])):
    step()
print((time.process_time() - t) / int(sys.argv[2]))
"""


def bench_step(a) -> None:
    base = {k: v for k, v in os.environ.items() if k not in CAP_VARS}
    base["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    got = {"no cap": [], "avx2 cap": []}
    for _ in range(a.repeat):
        for name, isa in (("no cap", None), ("avx2 cap", "avx2")):
            done = subprocess.run([sys.executable, "-c", STEP, a.step, "3"], env=cap_env(isa, base),
                                  capture_output=True, text=True, check=True)
            got[name].append(float(done.stdout.strip().splitlines()[-1]))
    emit([{"step": name, "CPU s per step (min)": min(v), "runs": " ".join(f"{x:.3f}" for x in v)}
          for name, v in got.items()], False)
    print(f"{a.step} training step CPU seconds, capped / uncapped (reference, minima): "
          f"{min(got['avx2 cap']) / min(got['no cap']):.3f}")


def bench_prepare(a) -> None:
    rows = {"no cap": [0.0, None], "avx2 cap": [0.0, None]}
    with tempfile.TemporaryDirectory(prefix="bench-isa-cap-prepare-") as tmp:
        for r in range(a.repeat):
            for name, isa in (("no cap", None), ("avx2 cap", "avx2")):
                cpu, rows[name][1] = prepare_cpu_s(a.prepare, isa, Path(tmp) / f"{name.replace(' ', '-')}-{r}")
                rows[name][0] += cpu
    emit([{"prepare": name, "CPU s": cpu, "features": sha[:12]} for name, (cpu, sha) in rows.items()], False)
    print(f"prepare CPU seconds, capped / uncapped (reference): {rows['avx2 cap'][0] / rows['no cap'][0]:.3f}; "
          f"features {'identical' if rows['avx2 cap'][1] == rows['no cap'][1] else 'DIFFER'}")
    ext = extract_cpu_s(a.prepare, a.repeat)
    print(f"extract_batch CPU seconds: float32 {ext['float32']:.2f}, float64 {ext['float64']:.2f}; "
          f"float64 / float32 (reference): {ext['float64'] / ext['float32']:.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("preset", nargs="?", default="tiny")
    p.add_argument("--data", type=Path, help="prepared features")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--prepare", type=Path, default=None, metavar="CORPUS", help="time prepare and extraction instead")
    p.add_argument("--step", default=None, metavar="PRESET", help="time a training step of PRESET's model instead")
    p.add_argument("--repeat", type=int, default=2, help="--prepare, --step: interleaved repeats of each")
    a = p.parse_args()
    if a.prepare:
        return bench_prepare(a)
    if a.step:
        return bench_step(a)
    if a.data is None:
        p.error("--data FEATS is required (or --prepare CORPUS)")
    with tempfile.TemporaryDirectory(prefix="bench-isa-cap-") as tmp:
        runs = {"no cap": train(a, None, Path(tmp) / "plain"), "avx2 cap": train(a, "avx2", Path(tmp) / "capped")}
    emit([{"run": name, "cpu capability": r["isa"].get("cpu_capability"), "oneDNN ISA": r["isa"].get("onednn_isa"),
           ONEDNN_VAR: r["isa"].get(ONEDNN_VAR), ATEN_VAR: r["isa"].get(ATEN_VAR), MKL_VAR: r["isa"].get(MKL_VAR),
           "train s/epoch": r["train s/epoch"]} for name, r in runs.items()], False)
    print()
    emit([{"run": name, **{k: repr(v) for k, v in point.items()}} for name, r in runs.items() for point in r["curve"]],
         False)  # repr: every digit, so that equal rows are equal floats
    same = curve.compare(runs["avx2 cap"]["curve"], runs["no cap"]["curve"])
    kernels = runs["no cap"]["isa"].get("cpu_capability") == runs["avx2 cap"]["isa"].get("cpu_capability")
    print(f"\ncapped vs uncapped: {same['text']}" + (" (the same kernels: this machine's own ISA is the cap's)"
                                                  if kernels else ""))
    ratio = runs["avx2 cap"]["train s/epoch"] / runs["no cap"]["train s/epoch"]
    print(f"train seconds per epoch, capped / uncapped (reference): {ratio:.3f} (a shared machine: noisy)")


if __name__ == "__main__":
    main()
