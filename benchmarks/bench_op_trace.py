"""Which op makes an Intel Xeon and an AMD EPYC train a reference seed otherwise, under the whole cap.

A reference seed's curve differs between the two makers under the whole ISA cap, at one thread,
with the same torch and features, while the kernel fingerprints (hardware/kernel_fingerprint.py)
agree (docs/reproduce.md). This traces what a reproduction computes first: the preset's model
built from the run's seed, its first ``--steps`` training steps on the loader's first batches of
epoch 1 (the train loop's step: SpecAugment, the objective, clip, the optimizer), then one
evaluation forward on the first batch, every ATen op with the sha256 of what it wrote
(hardware/op_trace.py). The trace runs in a child process under the AVX2 cap at one thread, in the
reference's recipe (precision, optimizer step), as ``speechperf reproduce`` trains.

Each maker's trace is stored (``--write``) in benchmarks/op_traces/PRESET.json; a run compares its
trace with every stored one and prints where they part: the first op whose output differs (its
name and input shapes: the kernel that follows the maker) or "same". The ratio is the position of
the first difference over the ops traced (1.0: the makers agree on every op).

Usage: python benchmarks/run.py op_trace --data FEATS [--preset tiny cpu ...] [--steps 2] [--write] [--json]
FEATS: the references' corpus (``speechperf corpus synth --hours 1.5 --seed 1``, prepared); traces
of other features are refused for comparison (the checksum is stored with each).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_convergence import child_env  # noqa: E402
from speechperf.atomic import atomic_write_text  # noqa: E402
from speechperf.hardware.op_trace import BY_MAKER, by_maker, first_difference, trace_digest  # noqa: E402
from speechperf.studies import curve  # noqa: E402
from speechperf.tables import emit  # noqa: E402

GOAL = ("docs/reproduce.md: under the whole ISA cap an Intel Xeon and an AMD EPYC compute a CPU preset's "
        "first training steps op for op the same, or the first op that differs is named")
REFERENCE = "the other CPU maker's trace of the same steps (benchmarks/op_traces/PRESET.json)"
RATIO = "position of the first differing op / ops traced (1.0: every op the same)"
DATA = True

STORE = HERE / "op_traces"
PRESETS = ["tiny", "cpu", "conformer-cpu", "transducer-cpu"]


def arguments(p) -> None:
    p.add_argument("--preset", nargs="+", default=PRESETS)
    p.add_argument("--steps", type=int, default=2,
                   help="training steps traced (the first builds the optimizer's state)")
    p.add_argument("--write", action="store_true", help="store this maker's trace in benchmarks/op_traces/PRESET.json")
    p.add_argument("--json", action="store_true", help="the rows as JSON instead of the table")


def run(a) -> dict:
    rows, out = [], {}
    for preset in a.preset:
        mine = trace_in_child(preset, Path(a.data), a.steps)
        stored = load(preset)
        rows += compared(preset, mine, stored)
        if a.write:
            print(f"wrote {store(preset, mine, stored)}")
        s, maker = mine["settings"], by_maker(mine["ops"])
        for op, n in maker.items():
            print(f"{preset}: {n} x {op}, whose CPU code follows the maker ({BY_MAKER[op]}): "
                  "no cap makes the makers agree on it")
        out[preset] = {"ops": len(mine["ops"]), "digest": trace_digest(mine["ops"]), "vendor": s["cpu_vendor"],
                       "machine": s["machine"], "kernels": s["kernels"], "by_maker": maker}
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        emit(rows, False)
    ratios = [r["first difference"] / r["ops"] for r in rows if r["against"] != r["vendor"] and r["comparable"]]
    return {"presets": out, "rows": rows, "ratio": min(ratios) if ratios else None}  # the other maker's, the worst


def trace_in_child(preset: str, data: Path, steps: int) -> dict:
    """This machine's trace of ``preset`` (a child under the AVX2 cap at one thread)."""
    cmd = [sys.executable, str(Path(__file__)), "--child", preset, str(data), str(steps)]
    done = subprocess.run(cmd, env=child_env("avx2"), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"op_trace {preset}: the traced child exited {done.returncode}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def load(preset: str) -> dict:
    path = STORE / f"{preset}.json"
    if not path.is_file():
        return {"preset": preset, "traces": {}}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SystemExit(f"{path}: not JSON ({e})") from None


def compared(preset: str, mine: dict, stored: dict) -> list[dict]:
    """One row per stored trace: where this machine's trace parts from it."""
    rows = []
    for vendor, theirs in sorted(stored["traces"].items()):
        why = incomparable(mine["settings"], theirs["settings"])
        diff = None if why else first_difference(mine["ops"], theirs["ops"])
        rows.append({"preset": preset, "vendor": mine["settings"]["cpu_vendor"], "against": vendor,
                     "ops": len(mine["ops"]), "comparable": why is None,
                     "first difference": len(mine["ops"]) if diff is None else diff["index"],
                     "verdict": why or verdict(diff), "differing after": diff["differing"] if diff else 0})
    if not rows:
        rows.append({"preset": preset, "vendor": mine["settings"]["cpu_vendor"], "against": None,
                     "ops": len(mine["ops"]), "comparable": False, "first difference": None,
                     "verdict": "no stored trace (--write stores this one)", "differing after": None})
    return rows


def incomparable(mine: dict, theirs: dict) -> str | None:
    """Why two traces cannot be compared (another torch, features or recipe), or None."""
    for key in ("torch", "features_sha256", "cap", "steps", "precision", "optim_impl", "ctc_kernel"):
        a, b = (curve.setting(s, key) if key in curve.RECORDED_BEFORE else s.get(key) for s in (mine, theirs))
        if a != b:  # a trace stored before a kernel setting existed: as curves of then (curve.RECORDED_BEFORE)
            return f"cannot be compared: {key} {a} (stored {b})"
    return None


def verdict(diff: dict | None) -> str:
    if diff is None:
        return "same: every op"
    a, b = diff["mine"], diff["theirs"]
    if diff["kind"] == "values":
        return f"op {diff['index']} {a[0]} ({a[1]}) computes otherwise"
    here, there = (f"{x[0]} ({x[1]})" if x else "the trace's end" for x in (a, b))
    return f"op {diff['index']}: {here} here, {there} there (the dispatch chose otherwise)"


def store(preset: str, mine: dict, stored: dict) -> Path:
    path = STORE / f"{preset}.json"
    stored["traces"][mine["settings"]["cpu_vendor"]] = mine
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(stored, indent=0, separators=(",", ":")) + "\n")
    return path


def child(preset: str, data: Path, steps: int) -> dict:
    """The trace itself (in the capped child): setup, ``steps`` train steps, one evaluation forward."""
    import torch

    from bench_step_floor import first_batches, setup
    from speechperf.config import load_preset
    from speechperf.data.check import train_splits_of
    from speechperf.data.units import ensure_units
    from speechperf.hardware.isa_cap import effective
    from speechperf.hardware.environment import cpu_model
    from speechperf.hardware.op_trace import OpTrace
    from speechperf.studies import rcp
    from speechperf.train.distributed import configure_determinism
    from speechperf.drive.reproduce import recipe_precision
    from speechperf.features.checksum import features_sha256
    from speechperf.results import upgrade
    from speechperf.train.step import train_step
    from speechperf.models.contract import planned_forward

    ref = rcp.load_reference(preset) or {}
    kernels = next((curve.forced(c["settings"]) for s in ref.get("seeds", []) for c in s.get("curves", [])), [])
    over = [*upgrade.overrides(ref.get("overrides", [])), f"train.system.precision={recipe_precision(ref)}",
            "train.seed=1", "train.system.threads=1", "train.system.device=cpu", *kernels]  # the curves' kernels
    cfg = load_preset(preset, over)
    configure_determinism(cfg.train.system.deterministic)
    torch.set_num_threads(1)
    ensure_units(data, cfg.loader.units, train_splits_of(data))  # BPE trained as a run would, where none is yet
    device, tc = torch.device("cpu"), cfg.train
    batches = list(first_batches(data, cfg, steps))
    with OpTrace() as trace:
        model, opt, scaler = setup(cfg, device)
        for batch in batches:
            train_step(model, batch, opt, scaler, device, tc, cfg.augment)
        model.eval()
        with torch.no_grad():
            planned_forward(model, batches[0].feats, batches[0].feat_lens, device)
    fx = effective()
    settings = {"cpu_vendor": curve.cpu_vendor(cpu_model()), "machine": cpu_model(),
                "torch": torch.__version__, "mkl": fx["mkl"], "onednn": fx["onednn"], "cap": fx["cap"],
                "features_sha256": features_sha256(data, cfg.loader.units), "steps": steps,
                "precision": tc.system.precision, "optim_impl": tc.optim.impl, "ctc_kernel": tc.system.ctc_kernel,
                "kernels": fx["kernels"]}
    return {"settings": settings, "ops": trace.ops}


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--child":
    p = argparse.ArgumentParser()
    p.add_argument("--child", dest="preset")
    p.add_argument("data", type=Path)
    p.add_argument("steps", type=int)
    c = p.parse_args()
    print(json.dumps(child(c.preset, c.data, c.steps)))
