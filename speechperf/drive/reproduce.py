"""``speechperf reproduce``: does this machine's stack compute the benchmark as the reference's
did? Train a reference seed for its first epochs under the ISA cap at 1 thread and compare
each epoch's validation loss, CER and WER with the reference curve, bit for bit.

The training runs in a child process (``speechperf train``): the cap's variables
(hardware/isa_cap.py) take effect only at process start (ATen reads its capability at
``import torch``). It trains the reference's recipe (the reference file's overrides) with
``train.stop.after_epochs=N``, which ends the run after N epochs without shortening the
schedule (a cosine's length is ``train.stop.max_epochs``): its first N epochs are the reference
seed's first N.

Outcomes (:data:`EXIT`): identical (0); differs from epoch k (1), with the first epoch's
values and what in the environment differs from the reference's; cannot be compared (3):
this machine's torch, or the features (their checksum, features/checksum.py), differ from
the reference curve's, so no difference would mean anything. That answer says what differs
and the next step: another build of the reference's torch release (a CUDA wheel against the
CPU one) or another release: run where the reference's wheel is installed; features
prepared by a speechperf whose features depended on the CPU (no ``made_with`` in
features.json), or of another corpus (its utterance counts against the reference's): prepare
the references' corpus again, which ``--prepare CORPUS`` does before training. Bad input
(2): no reference, a reference without curves, a folder that is not prepared features.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from speechperf.children import sigterm_stops
from speechperf.config import SECTIONS, ConfigError, RunConfig, load_preset, validate
from speechperf.corpus.librispeech import is_train_split
from speechperf.errors import RunFailed, SpeechperfError
from speechperf.features.checksum import features_sha256
from speechperf.features.prepare import prepare
from speechperf.models import external
from speechperf.studies import curve, rcp
from speechperf.results import upgrade
from speechperf.results.layout import RUN_FILE
from speechperf.results.view import RunView
from speechperf.hardware.environment import cpu_model
from speechperf.hardware.isa_cap import cap_env

EXIT = {curve.IDENTICAL: 0, curve.DIFFERS: 1, curve.NOT_COMPARABLE: 3}  # bad input: 2 (SpeechperfError)
DEFAULT_EPOCHS = 2


class ReproduceError(SpeechperfError):
    """A reproduction that cannot start: no reference, no curves, no features (names the file)."""


def reproduce(preset: str, data: Path, seed: int | None = None, epochs: int = DEFAULT_EPOCHS,
              out: Path | None = None, quiet: bool = False, corpus: Path | None = None) -> dict:
    """Train reference seed ``seed`` (default: the first with curves) of ``preset`` on the
    features ``data`` for ``epochs`` epochs and compare it with the reference curve:
    {"verdict", "text", "epochs": per-epoch rows, "differences", "settings", "reference
    settings", "run", "seconds"}. ``out``: the run folder (kept; must not hold a run), else a
    temporary one. ``corpus``: where ``data`` is not the features of any curve, prepare this
    corpus into a new folder beside ``data`` (``DATA-reproduce``) and use that."""
    ref, path = _reference(preset)
    seed = seed if seed is not None else next(s["seed"] for s in ref["seeds"] if s.get("curves"))
    if not curve.curves_of(ref, seed):
        raise ReproduceError(f"{path}: reference seed {seed} has no curve (seeds with one: "
                             f"{', '.join(str(s['seed']) for s in ref['seeds'] if s.get('curves'))})")
    chosen, data = _curve_for(ref, seed, Path(data), corpus, quiet)
    if isinstance(chosen, str):
        return _not_comparable(preset, seed, chosen)
    theirs = chosen["settings"]
    if epochs < 1 or epochs > len(chosen["epochs"]):
        raise ReproduceError(f"--epochs {epochs}: the reference curve of seed {seed} has {len(chosen['epochs'])}")
    why = torch_differs(metadata.version("torch"), theirs.get("torch"))
    if why:
        return _not_comparable(preset, seed, why)
    keep = out is not None
    folder = Path(out) if keep else Path(tempfile.mkdtemp(prefix=f"reproduce-{preset}-"))
    with sigterm_stops():  # a SIGTERM: the training child stopped, the temporary run removed, exit 143
        return _reproduce(preset, data, seed, epochs, folder, keep, ref, chosen, theirs, quiet)


def _reproduce(preset, data, seed, epochs, folder: Path, keep: bool, ref, chosen, theirs, quiet) -> dict:
    """Train the reference seed's first ``epochs`` into ``folder`` and judge its curve (removed after,
    unless kept)."""
    try:
        if keep and (folder / RUN_FILE).exists():
            raise ReproduceError(f"{folder}: already holds a run; give a new --out (a reproduction trains from "
                                 "scratch)")
        start = time.perf_counter()
        overrides = upgrade.overrides(chosen.get("overrides", ref.get("overrides", [])))  # an earlier release's keys
        _train(preset, data, seed, epochs, folder, theirs, overrides, quiet, recipe_precision(ref))
        result = judge(folder, ref, chosen, epochs)
        return {"preset": preset, "seed": seed, **result, "run": str(folder) if keep else None,
                "seconds": time.perf_counter() - start}
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)


def _reference(preset: str) -> tuple[dict, Path]:
    path = rcp.reference_path(preset)
    ref = rcp.load_reference(preset)  # a damaged file: rcp.ReferenceError (exit 2)
    if ref is None:
        raise ReproduceError(f"preset {preset!r} has no reference ({path} does not exist)")
    # what a reproduction trains and compares with: a file of another preset's (or none's) or
    # without its recipe was trained (exit 0, "identical") or judged not comparable (exit 3)
    if ref.get("preset") != preset:
        raise ReproduceError(f"{path}: field 'preset' should be {preset!r}, found {ref.get('preset')!r}")
    if not ref.get("recipe"):
        raise ReproduceError(f"{path}: field 'recipe' should be the reference's training settings (rcp.recipe of "
                             f"its config), found {ref.get('recipe', 'no such field')!r}")
    check_recipe(ref, path, preset)
    if not curve.has_curves(ref):
        raise ReproduceError(f"{path} has no reference curves (per-epoch validation loss, CER and WER of its seeds): "
                             "it only says how many epochs each seed took; measure them with `python "
                             f"benchmarks/run.py convergence {preset} --seeds N --curves 2 --data FEATS --write`")
    return ref, path


def check_recipe(ref: dict, path: Path, preset: str) -> None:
    """Refuse (exit 2, naming the file and the field) a reference whose recipe or overrides this
    release cannot train as written: an unknown section or field, a value of another type or an
    invalid one (``"train.optim.lr": "fast"``), before anything trains (a recipe that differs only
    once the run is judged made a 2-epoch training end "not comparable", exit 3). A model module
    the recipe names is not imported (models/external.py's ``reading``)."""
    sections: dict[str, dict] = {}
    for key, value in upgrade.recipe(ref["recipe"]).items():  # an earlier release's train.lr: train.optim.lr
        section, _, name = key.partition(".")
        if section not in SECTIONS or not name:
            raise ReproduceError(f"{path}: field 'recipe.{key}' is not a configuration field (SECTION.FIELD, a section "
                                 f"of {', '.join(SECTIONS)})")
        *parents, leaf = name.split(".")
        node = sections.setdefault(section, {})
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    lists = [("recipe", None), ("overrides", upgrade.overrides(ref.get("overrides", [])))]
    lists += [(f"seeds[{i}].curves[{j}].overrides", upgrade.overrides(c["overrides"]))
              for i, s in enumerate(ref["seeds"])
              for j, c in enumerate(s.get("curves") or []) if "overrides" in c]
    for field, overrides in lists:
        try:
            with external.reading(f"reference {path}"):
                if overrides is None:
                    validate(RunConfig.from_dict({"preset": preset, **sections}))
                else:
                    load_preset(preset, list(overrides))
        except ConfigError as e:
            raise ReproduceError(f"{path}: field {field!r} is not a configuration this release trains: {e}") from None


def _curve_for(ref: dict, seed: int, data: Path, corpus: Path | None, quiet: bool) -> tuple[dict | str, Path]:
    """(the curve of ``seed`` on the features ``data``, data), or (why there is none and what to
    do, data); with ``corpus``, a miss prepares it into ``DATA-reproduce`` and tries that. The checksum
    covers the reference's own units (a character recipe: none), as its run recorded it: BPE units another
    run trained into the folder change nothing here."""
    units = ref.get("recipe", {}).get("loader.units", "char")
    features = features_sha256(data, units)
    if features is None:
        raise ReproduceError(f"{data}: not a prepared features folder (no stats.json, no SPLIT/index.json)")
    chosen = curve.pick(ref, seed, features, _vendor())
    if chosen is not None:
        return chosen, data
    if corpus is None:
        return features_differ(data, features, ref, seed), data
    fresh = data.with_name(f"{data.name}-reproduce")
    if not quiet:
        print(f"reproduce: preparing {corpus} into {fresh}", file=sys.stderr, flush=True)
    prepare(Path(corpus), fresh, progress=not quiet)
    features = features_sha256(fresh, units)
    chosen = curve.pick(ref, seed, features, _vendor())
    return (chosen, fresh) if chosen is not None else (features_differ(fresh, features, ref, seed), fresh)


def _vendor() -> str | None:
    """This machine's CPU maker, as its runs' settings will record it."""
    return curve.cpu_vendor(cpu_model())


def torch_differs(mine: str, theirs: str | None) -> str | None:
    """Why torch ``mine`` cannot reproduce a curve made with ``theirs``, and what to do; None
    when they are the same. A build of the same release (2.13.0+cu130 against 2.13.0+cpu) is
    named as such: its CPU kernels are compiled and linked apart, so no difference would mean
    anything either."""
    if mine == theirs:
        return None
    release = (theirs or "").split("+")[0]
    wheel = (f"run reproduce where torch {theirs} is installed (in a virtual environment of its own: pip install "
             f"torch=={release} --index-url https://download.pytorch.org/whl/cpu)")
    if mine.split("+")[0] == release:
        return (f"torch {mine} is the reference's release {release} in another build (reference {theirs}): "
                f"{wheel}")
    return f"torch {mine} (reference {theirs}): another release computes other kernels; {wheel}"


def features_differ(data: Path, features: str, ref: dict, seed: int) -> str:
    """Why the features ``data`` (checksum ``features``) are not those of any curve of ``seed``,
    and what to do: prepared by a speechperf whose features depended on the CPU, another
    corpus (utterance counts), or another preparation."""
    head = f"features {features[:12]} are not those of any curve of seed {seed} ({_curves_on(ref, seed)})"
    curves = curve.curves_of(ref, seed)
    made = _features_json(data).get("made_with")
    if made is None:
        return (f"{head}: {data} was prepared without made_with in features.json, by a speechperf whose float16 "
                "features depended on the CPU's matrix kernels; prepare the corpus again into a new folder "
                "(speechperf prepare CORPUS NEW, or reproduce --prepare CORPUS)")
    theirs = [((c.get("corpus") or {}).get("fingerprint") or {}).get("train_utterances") for c in curves]
    mine = _train_counts(data)
    if mine and all(theirs) and not {*theirs} & {*mine.values(), sum(mine.values())}:
        counts = ", ".join(f"{split} {n}" for split, n in sorted(mine.items()))
        return (f"{head}: another corpus (training utterances {counts}; the references trained on "
                f"{', '.join(map(str, theirs))}); make the references' corpus ({_corpus_words(curves[0])}) and "
                "prepare it (reproduce --prepare CORPUS)")
    return (f"{head}: another corpus or preparation (made with {made}); prepare the references' corpus "
            f"({_corpus_words(curves[0]) if curves else 'see docs/reproduce.md'}) with this speechperf "
            "(reproduce --prepare CORPUS)")


def _features_json(data: Path) -> dict:
    try:
        return json.loads((data / "features.json").read_text())
    except (OSError, ValueError):
        return {}


def _train_counts(data: Path) -> dict | None:
    """{split: utterances} of the features' training splits (their indexes); None if unreadable."""
    try:
        return {p.name: len(json.loads((p / "index.json").read_text())["utterances"])
                for p in data.iterdir() if p.is_dir() and is_train_split(p.name) and (p / "index.json").is_file()}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _curves_on(ref: dict, seed: int) -> str:
    return ", ".join(f"{c['settings'].get('features_sha256', '?')[:12]} ({_corpus_words(c)})"
                     for c in curve.curves_of(ref, seed))


def _corpus_words(c: dict) -> str:
    synth = c.get("corpus", {}).get("synth") or {}
    return (f"speechperf corpus synth --hours {synth.get('hours')} --seed {synth.get('seed')}" if synth
            else c.get("corpus", {}).get("data", "corpus not recorded"))


def _not_comparable(preset: str, seed: int, why: str) -> dict:
    return {"preset": preset, "seed": seed, "verdict": curve.NOT_COMPARABLE, "text": f"cannot be compared: {why}",
            "epochs": [], "differences": [why], "run": None, "seconds": 0.0}


def recipe_precision(ref: dict) -> str:
    """The precision a reference was measured in (its recipe's; every reference before
    ``train.system.precision=auto`` was fp32): a reproduction trains in it, never in what ``auto`` picks here."""
    return upgrade.recipe(ref.get("recipe", {})).get("train.system.precision", "fp32")


def child_command(preset: str, data: Path, seed: int, epochs: int, folder: Path, overrides,
                  resume: str = "no", precision: str = "fp32", kernels: list[str] = ()) -> list[str]:
    """The ``speechperf train`` command of a reproduction (the child process); ``overrides``:
    the reference's (its recipe), before the settings a reproduction fixes; ``precision``: the
    reference's (:func:`recipe_precision`), forced over the preset's ``auto``; ``kernels``: the
    curve's optimizer step and CTC kernel (:func:`curve.forced`: not part of the recipe, but other
    kernels of the same step sum in another order), forced over the preset's."""
    return [sys.executable, "-m", "speechperf", "train", "--preset", preset, "--data", str(data), "--out", str(folder),
            "--resume", resume, "--json", *overrides, *kernels, f"train.system.precision={precision}",
            f"train.seed={seed}", f"train.system.threads={curve.ONE_THREAD}",
            f"train.stop.after_epochs={epochs}", "train.stop.time_cap_minutes=0", "train.eval.final_splits=none"]


def _train(preset: str, data: Path, seed: int, epochs: int, folder: Path, theirs: dict, overrides, quiet: bool,
           precision: str = "fp32") -> None:
    """Train the child under the reference's cap, in the reference's ``precision``; its output goes
    to ``folder/reproduce.log``."""
    cmd = child_command(preset, data, seed, epochs, folder, overrides, precision=precision,
                        kernels=curve.forced(theirs))
    if not quiet:
        print(f"reproduce: training {preset} seed {seed} for {epochs} epochs under the {theirs.get('cap')} cap at "
              f"1 thread (log: {folder / 'reproduce.log'})", file=sys.stderr, flush=True)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "reproduce.log", "w", encoding="utf-8") as log:
        done = subprocess.run(cmd, env=cap_env(theirs.get("cap")), stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = (folder / "reproduce.log").read_text(errors="replace")[-2000:]
        raise RunFailed(f"reproduce: the training exited {done.returncode} ({' '.join(cmd[2:])}):\n{tail}")


def judge(folder: Path, ref: dict, chosen: dict, epochs: int) -> dict:
    """The run in ``folder`` against the curve ``chosen`` over ``epochs`` epochs, as recorded
    (its config.json, env.json and results.db): {"verdict", "text", "epochs", "differences",
    "settings", "reference settings"}."""
    with RunView.open(Path(folder)) as run:
        config, env, evals = run.config, run.env, run.rows.evals()
    mine, theirs = curve.settings_of(config, env), chosen["settings"]
    differences = curve.differences(mine, theirs)
    rows = _rows(curve.curve_of(evals), chosen["epochs"], epochs)
    base = {"epochs": rows, "differences": differences, "settings": mine, "reference settings": theirs}
    why = curve.comparable(mine, theirs) or curve.recipe_differs(ref, config)
    if why:
        return {**base, "verdict": curve.NOT_COMPARABLE, "text": f"cannot be compared: {why}"}
    if len(evals) < epochs:
        raise RunFailed(f"reproduce: the run in {folder} evaluated {len(evals)} epochs of {epochs}")
    result = curve.compare(curve.curve_of(evals), chosen["epochs"], epochs)
    text = result["text"]
    if result["verdict"] == curve.DIFFERS and differences:
        text += "; environment differs from the reference's: " + "; ".join(differences)
    elif result["verdict"] == curve.DIFFERS:
        text += ("; no recorded setting differs from the reference's: this CPU's kernels compute the training "
                 f"otherwise (this run: {env.get('cpu_model')}; the reference: "
                 f"{(chosen.get('measured') or {}).get('machine', 'not recorded')}; see docs/reproduce.md)")
    return {**base, "verdict": result["verdict"], "text": text}


def _rows(mine: list[dict], reference: list[dict], epochs: int) -> list[dict]:
    """Per epoch: this run's loss and target metrics beside the reference's (those it recorded:
    curve.held), and whether all are equal."""
    out = []
    for a, b in zip(mine[:epochs], reference[:epochs]):
        row = {"epoch": a["epoch"]}
        for m in curve.held(b):
            row[m], row[f"reference {m}"] = a.get(m), b.get(m)
        row["same"] = all(curve.same(a.get(m), b.get(m)) for m in curve.held(b))
        out.append(row)
    return out
