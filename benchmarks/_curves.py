"""bench_convergence.py ``--curves N``: each reference seed's first N epochs, trained under the
whole AVX2 cap at 1 thread as ``speechperf reproduce`` trains them, stored (``--write``) as
that seed's curve in ``speechperf/config/rcp/PRESET.json`` (speechperf/studies/curve.py).

Resumable as the rest of bench_convergence: each seed trains into OUT/seed-S with ``--resume
auto`` (a finished seed is only read again).
"""
from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from speechperf.results import upgrade
from speechperf.atomic import atomic_write_text  # noqa: E402
from speechperf.features.checksum import OVER, features_sha256  # noqa: E402
from speechperf.studies import curve, rcp  # noqa: E402
from speechperf.results.view import RunView  # noqa: E402
from speechperf.tables import emit  # noqa: E402
from speechperf.hardware.machine import hardware  # noqa: E402
from speechperf.drive.reproduce import child_command, recipe_precision  # noqa: E402
from speechperf.drive.seeds import parse_seeds, seed_folder  # noqa: E402


def commit() -> str:
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return git("rev-parse", "HEAD") + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def synth_params(feats: Path) -> dict:
    """The embedded corpus' synthesis (hours, seed) where the features sit beside it (the demo's layout)."""
    synth = feats.parent / "corpus" / "SYNTH.json"
    if not synth.is_file():
        return {}
    params = json.loads(synth.read_text()).get("params", {})
    return {"synth": {"hours": params.get("hours"), "seed": params.get("seed")}}


def measure_curves(a, out: Path, env: dict) -> int:
    """Train (or read) every seed's first ``a.curves`` epochs; print them; ``a.write``: store them."""
    path = rcp.reference_path(a.preset)
    ref = rcp.load_reference(a.preset)
    if ref is None:
        sys.exit(f"{path}: no reference to add curves to (measure its seeds first)")
    overrides = upgrade.overrides(ref.get("overrides", []))  # an earlier release's train.X keys: this one's
    entries = []
    for seed in parse_seeds(a.seeds):
        folder = seed_folder(out, seed)
        cmd = child_command(a.preset, a.data, seed, a.curves, folder, overrides, resume="auto",
                            precision=recipe_precision(ref))
        print(f"seed {seed}: {' '.join(cmd[3:])}", flush=True)
        done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL)
        if done.returncode != 0:
            sys.exit(f"seed {seed}: train exited {done.returncode} in {folder}; the same command continues it")
        entries.append(curve_entry(folder, a.data, overrides, commit()))
    emit([{"seed": e["settings"]["seed"], "epoch": p["epoch"], "loss": p["loss"], "cer": p["cer"], "wer": p["wer"]}
          for e in entries for p in e["epochs"]], False)
    if a.write:
        for e in entries:
            why = curve.recipe_differs(ref, e.pop("_config"))
            if why:
                sys.exit(f"{path}: seed {e['settings']['seed']} trained {why}")
        print(f"wrote {write_curves(path, ref, entries, {**synth_params(Path(a.data)), 'data': str(a.data)})}")
    return 0


def curve_entry(folder: Path, data: Path, overrides: list[str], at_commit: str) -> dict:
    """A seed's curve from its run folder: the epochs as recorded and the settings they need."""
    with RunView.open(folder) as run:
        config, env, evals, status = run.config, run.env, run.rows.evals(), run.rows.row().get("status")
    settings = curve.settings_of(config, env)
    settings["features_sha256"] = settings["features_sha256"] or features_sha256(Path(data))  # runs before env had it
    return {"epochs": curve.curve_of(evals), "settings": {**settings, "features_checksum": OVER},
            "overrides": overrides, "corpus": {"fingerprint": rcp.corpus_of(folder / "events.log")},
            "measured": {"commit": at_commit, "date": _date(run.info), "host": platform.node(),
                         "machine": hardware(env), "status": status}, "_config": config}


def _date(info: dict) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(info.get("created_at", 0), datetime.timezone.utc).date().isoformat()


def write_curves(path: Path, ref: dict, entries: list[dict], corpus: dict) -> Path:
    """Merge ``entries`` into ``ref``'s seeds (a curve on the same features replaces the old one)."""
    seeds = {s["seed"]: s for s in ref["seeds"]}
    for e in entries:
        seed = e["settings"]["seed"]
        if seed not in seeds:
            sys.exit(f"{path}: no reference seed {seed} to add a curve to")
        e["corpus"] = {**e["corpus"], **corpus}
        same = ("features_sha256", "cpu_vendor")  # one curve per features and CPU maker
        kept = [c for c in seeds[seed].get("curves", [])
                if any(c["settings"].get(k) != e["settings"].get(k) for k in same)]
        seeds[seed]["curves"] = kept + [e]
    atomic_write_text(path, json.dumps(ref, indent=1) + "\n")
    return path
