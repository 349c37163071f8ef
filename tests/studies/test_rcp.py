"""Runs and groups against reference convergence points (mlperf-logging's RCP statistics)."""
import json
from types import SimpleNamespace

import pytest

from speechperf.metric import DEFAULT_TARGET
from speechperf.results import upgrade
from speechperf.studies import rcp, study
from speechperf.studies.aggregate import SeedRun, aggregate

CORPUS = {"train_utterances": 100, "eval_utterances": 10}
CONFIG = {"preset": "refd", "model": {"name": "ds2"},
          "train": {"seed": 1, "optim": {"lr": 0.001}, "system": {"threads": 1},
                    "stop": {"target_metric": DEFAULT_TARGET, "target": 0.0, "target_epochs": 3}}}


@pytest.fixture
def reference(tmp_path, monkeypatch):
    """Writes speechperf/config/rcp/refd.json (in a temporary RCP_DIR) with these epochs to CER 10."""
    monkeypatch.setattr(rcp, "RCP_DIR", tmp_path)

    def write(epochs, preset="refd"):
        ref = {"format": rcp.FORMAT, "preset": preset, "metric": "cer", "window": 3, "targets": [10.0],
               "recipe": rcp.recipe(CONFIG), "corpus": {"fingerprint": CORPUS},
               "seeds": [{"seed": s, "epochs": {"10": e}} for s, e in enumerate(epochs, 1)]}
        (tmp_path / f"{preset}.json").write_text(json.dumps(ref))
    return write


def run(seed: int, epochs: int | None, config=CONFIG, status="max_epochs") -> SeedRun:
    """A run whose 3-epoch median of CER first reaches 10 at ``epochs`` (None: never), 1 min per epoch."""
    cers = [9.0 if epochs is not None and e >= epochs - 1 else 30.0 for e in range(1, 15)]
    cfg = json.loads(json.dumps(config))
    cfg["train"]["seed"] = seed
    return SeedRun(f"s{seed}", "ds2", "2-core X", cfg, status, tuple((60.0 * e, c) for e, c in enumerate(cers, 1)), CORPUS)


def checks(runs):
    per_run, groups, _ = aggregate(runs, lambda r: (10.0,), "cer", 3)
    return [r["RCP check"] for r in per_run], [g["RCP check"] for g in groups]


def test_mlperf_statistics_by_hand(reference):
    # no spread in the reference: MLPerf's minimum is its (olympic) mean itself
    assert rcp.limits((9, 9, 9, 9, 9), 1) == {"RCP mean": 9.0, "RCP stdev": 0.0, "min epochs": 9.0}
    lim = rcp.limits((8, 9, 9, 10, 10, 11), 1)
    assert lim["RCP mean"] == 9.5 and lim["RCP stdev"] == pytest.approx(0.957427, abs=1e-6)  # olympic mean, np.std
    assert 5 < lim["min epochs"] < 9.5 and rcp.limits((8, 9, 9, 10, 10, 11), 8)["min epochs"] > lim["min epochs"]


def test_a_run_faster_than_its_reference_is_flagged_one_inside_it_is_not(reference):
    reference([8, 9, 9, 10, 10, 11])
    per_run, _ = checks([run(1, 3), run(2, 9)])
    assert per_run == [rcp.FASTER, rcp.OK]
    reference([9, 9, 9, 9, 9])
    assert checks([run(1, 8)])[0] == [rcp.FASTER] and checks([run(1, 9)])[0] == [rcp.OK]


def test_a_group_is_checked_on_its_olympic_mean(reference):
    reference([8, 9, 9, 10, 10, 11])
    # each seed alone is inside what one run may do (>= 6.98 epochs); five seeds at 7-8 (olympic mean 7)
    # are too fast for the reference (>= 8.03 for a mean of 3)
    runs = [run(s, e) for s, e in zip(range(1, 6), (7, 7, 8, 7, 7))]
    per_run, (group,) = checks(runs)
    assert set(per_run) == {rcp.OK} and group == rcp.FASTER
    assert checks([run(s, e) for s, e in zip(range(1, 6), (8, 9, 10, 9, 11))])[1] == [rcp.OK]


def test_failing_where_the_reference_always_converges_is_flagged(reference):
    reference([8, 9, 9, 10, 10])
    per_run, (group,) = checks([run(1, 9), run(2, None), run(3, None, status="running")])
    assert per_run == [rcp.OK, rcp.FAILED, "unfinished"] and group == f"1 of 2 {rcp.FAILED}"


def test_no_reference_is_said(reference):
    reference([8, 9, 9, 10, 10])
    other = {**CONFIG, "preset": "cpu-without-rcp"}
    assert checks([run(1, 9, config=other)])[0] == ["no reference for preset 'cpu-without-rcp'"]
    changed = {**CONFIG, "train": {**CONFIG["train"], "optim": {"lr": 0.01}}}
    (why,) = checks([run(1, 9, config=changed)])[0]
    assert why.startswith("reference is for another recipe: train.optim.lr=0.01 (reference 0.001)")
    other_corpus = SeedRun("x", "ds2", "m", CONFIG, "max_epochs", run(1, 9).evals, {"train_utterances": 5})
    assert checks([other_corpus])[0][0].startswith("reference measured on another corpus")


def test_a_field_added_after_the_reference_counts_at_its_default(reference):
    """A reference recorded before a field existed (here [algo] and train.schedule.lr_step_epochs) trained
    with that field's default: a run at the default matches it, one off the default does not;
    a field today's code does not know never matches."""
    from speechperf.config import load_preset

    full = {**load_preset("cpu").to_dict(), "preset": "refd"}
    reference([8, 9, 9, 10, 10])
    path = rcp.RCP_DIR / "refd.json"
    ref = json.loads(path.read_text())
    old = {k: v for k, v in rcp.recipe(full).items() if not k.startswith("algo.") and k != "train.schedule.lr_step_epochs"}
    path.write_text(json.dumps({**ref, "recipe": old}))
    assert checks([run(1, 9, config=full)])[0] == [rcp.OK]
    stepped = {**full, "train": {**full["train"], "schedule": {**full["train"]["schedule"], "lr_step_epochs": 4}}}
    (why,) = checks([run(1, 9, config=stepped)])[0]
    assert why == "reference is for another recipe: train.schedule.lr_step_epochs=4 (reference 1)"
    path.write_text(json.dumps({**ref, "recipe": {**old, "train.future_field": 1}}))
    (why,) = checks([run(1, 9, config=full)])[0]
    assert why.startswith("reference is for another recipe") and "train.future_field" in why


def test_run_check_for_summary_json(reference, tmp_path):
    reference([9, 9, 9, 9, 9])
    evals = [{"clock_s": c, "cer": v} for c, v in run(1, 5).evals]
    (tmp_path / "events.log").write_text("".join(
        f':::MLLOG {{"key": "{k}", "value": {v}}}\n' for k, v in (("train_samples", 100), ("eval_samples", 10))))
    out = study.run_check(_finished_run(CONFIG, evals, tmp_path), "success")
    assert out["reference"] == "refd.json" and out["checks"][0]["RCP check"] == rcp.FASTER
    assert out["checks"][0]["epochs to target"] is not None  # the evals came from the run's rows
    nope = _finished_run({**CONFIG, "preset": "nope"}, evals, tmp_path)
    assert study.run_check(nope, "success")["check"] == "no reference for preset 'nope'"


def _finished_run(config: dict, evals: list[dict], folder) -> SimpleNamespace:
    """What run_check reads of the recorder's Run: config, env, its evaluation rows, its folder, its workload."""
    return SimpleNamespace(config=config, env={}, folder=folder, rows=SimpleNamespace(evals=lambda: evals),
                           workload={"model": "ds2", "params": None})


def test_the_shipped_tiny_reference():
    ref = rcp.load_reference("tiny")
    assert ref is not None and len(ref["seeds"]) >= 5
    for seed in ref["seeds"]:
        assert {"commit", "machine", "isa", "threads", "torch", "date"} <= set(seed["measured"])
    assert rcp.load_reference("paper") is None


def _damage(ref: dict, field: str, value) -> dict:
    """``ref`` with the dotted/indexed ``field`` ("seeds[0].curves[0].epochs[0].cer") set to ``value``."""
    import re

    keys = [int(k) if k.isdigit() else k for k in re.findall(r"[^.\[\]]+", field)]
    node = ref
    for k in keys[:-1]:
        node = node[k]
    node[keys[-1]] = value
    return ref


@pytest.mark.parametrize("field,value,said", [
    ("seeds[0].curves[0].epochs[0].cer", "x", "'seeds[0].curves[0].epochs[0].cer' should be an integer or a number, found "
                                                 "str 'x'"),
    ("seeds[0].curves[0].epochs[0].loss", None, "'seeds[0].curves[0].epochs[0].loss' should be an integer or a number"),
    ("seeds[0].curves[0].epochs[1].wer", float("nan"), "'seeds[0].curves[0].epochs[1].wer' should be a finite "
                                                       "number >= 0, found nan"),
    ("seeds[0].curves[0].epochs[1].epoch", 3, "'seeds[0].curves[0].epochs[1].epoch' should be 2 (epochs in order"),
    ("seeds[0].curves[0].epochs", [], "'seeds[0].curves[0].epochs' should be a list of epochs from epoch 1"),
    ("seeds[0].curves[0].settings", {"torch": "2.13.0+cpu"}, "'seeds[0].curves[0].settings.features_sha256' "
                                                             "should be a string, found None"),
    ("seeds[0].curves", "x", "'seeds[0].curves' should be a list"),
    ("seeds[0].curves[0].settings.optim_impl", "fused train.seed=9", "'seeds[0].curves[0].settings.optim_impl' "
                                                                     "should be one of default, foreach, fused"),
    ("targets", [float("nan")], "'targets[0]' should be an error rate in (0, 100] %, found nan"),
    ("targets", [-5], "'targets[0]' should be an error rate in (0, 100] %, found -5"),
    ("targets", [], "'targets' should be a list of error rates"),
    ("window", 0, "'window' should be a whole number of epochs >= 1, found 0"),
    ("window", 2.5, "'window' should be a whole number of epochs >= 1, found 2.5"),
    ("metric", "bogus", "'metric' should be one of cer, wer, ser, found 'bogus'"),
    ("seeds[1].seed", None, "'seeds[1].seed' should be a whole number, found None"),
    ("seeds[1].epochs", {"38": 0}, "'seeds[1].epochs.38' should be a whole number of epochs >= 1, found 0"),
    ("seeds[1].epochs", {"abc": 3}, "'seeds[1].epochs' should be keyed by targets written as numbers, found 'abc'"),
    ("seeds[1].minutes", {"38": -1.0}, "'seeds[1].minutes.38' should be a finite number >= 0, found -1.0"),
    ("seeds[1].final_cer", float("inf"), "'seeds[1].final_cer' should be a finite error rate >= 0, found inf"),
])
def test_every_field_of_a_reference_file_is_checked_on_load(tmp_path, monkeypatch, field, value, said):
    """The shipped tiny reference with one field damaged is refused naming the file and field
    (exit 2): never a verdict about the run or the machine."""
    ref = _damage(json.loads(rcp.reference_path("tiny").read_text()), field, value)
    (tmp_path / "tiny.json").write_text(json.dumps(ref))
    monkeypatch.setattr(rcp, "RCP_DIR", tmp_path)
    with pytest.raises(rcp.ReferenceError) as e:
        rcp.load_reference("tiny")
    assert e.value.exit_code == 2 and str(tmp_path / "tiny.json") in str(e.value) and said in str(e.value), \
        str(e.value)


def test_every_shipped_reference_passes_its_checks():
    for path in sorted(rcp.RCP_DIR.glob("*.json")):
        preset, _, numerics = path.stem.partition(".")  # cpu.json: fp32; cpu.bf16.json: bf16
        ref = rcp.load_reference(preset, numerics or None)
        assert ref["preset"] == preset and rcp.reference_path(preset, numerics or None) == path
        # a committed reference names the flat keys of the release it was measured with: read through the table
        assert upgrade.recipe(ref["recipe"]).get("train.system.precision", "fp32") == (numerics or "fp32"), path


def test_a_run_is_checked_against_the_reference_of_its_own_precision(tmp_path, monkeypatch):
    fp32 = json.loads(rcp.reference_path("tiny").read_text())
    bf16 = {**fp32, "recipe": {**fp32["recipe"], "train.system.precision": "bf16"},
            "seeds": [{**s, "epochs": {k: 1 for k in s["epochs"]}} for s in fp32["seeds"]]}
    (tmp_path / "tiny.json").write_text(json.dumps(fp32))
    monkeypatch.setattr(rcp, "RCP_DIR", tmp_path)
    assert rcp.reference_path("tiny", "bf16") == tmp_path / "tiny.bf16.json"
    assert rcp.reference_path("tiny", "fp32") == rcp.reference_path("tiny") == tmp_path / "tiny.json"
    config = {"preset": "tiny", "train": {"system": {"precision": "bf16"}}}
    assert rcp.load_reference("tiny", "bf16") is None  # never fp32's epochs for a bf16 run
    said = rcp.applies(None, "tiny", config, {}, "cer", 3, 10.0)
    assert said == "no bf16 reference for preset 'tiny'"
    (tmp_path / "tiny.bf16.json").write_text(json.dumps(bf16))
    assert rcp.epochs_of(rcp.load_reference("tiny", "bf16"), fp32["targets"][0])[0] == 1
    assert rcp.epochs_of(rcp.load_reference("tiny"), fp32["targets"][0]) == rcp.epochs_of(fp32, fp32["targets"][0])


@pytest.mark.parametrize("value", ["x", None])
def test_reproduce_refuses_a_damaged_curve_instead_of_blaming_the_machine(tmp_path, monkeypatch, tiny_features,
                                                                          capsys, value):
    from speechperf.cli import main

    ref = _damage(json.loads(rcp.reference_path("tiny").read_text()), "seeds[0].curves[1].epochs[0].cer", value)
    (tmp_path / "tiny.json").write_text(json.dumps(ref))
    monkeypatch.setattr(rcp, "RCP_DIR", tmp_path)
    assert main(["reproduce", "tiny", "--data", str(tiny_features)]) == 2
    out, err = capsys.readouterr()
    assert f"{tmp_path / 'tiny.json'}: field 'seeds[0].curves[1].epochs[0].cer'" in err and "differs" not in out + err


def test_a_recipe_of_every_algorithms_fields_is_the_named_algorithms(reference):
    """config.json's [algo] as this release wrote it (every algorithm's fields) matches a
    reference of the algorithm's own fields; a field of the named algorithm off its default does not."""
    from speechperf.config import load_preset

    full = {**load_preset("cpu").to_dict(), "preset": "refd"}
    every = {"name": "sync", "sync_every": 1, "block_lr": 1.0, "block_momentum": -1.0, "bmuf_c": 1.05,
             "nesterov": True, "outer_lr": 0.7, "outer_momentum": 0.9, "easgd_alpha": 0.1, "round_robin": False}
    reference([8, 9, 9, 10, 10])
    path = rcp.RCP_DIR / "refd.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "recipe": rcp.recipe(full)}))
    assert checks([run(1, 9, config={**full, "algo": every})])[0] == [rcp.OK]
    bsp = {**full, "algo": {**every, "name": "bsp", "sync_every": 3}}
    (why,) = checks([run(1, 9, config=bsp)])[0]
    assert why == "reference is for another recipe: algo.name='bsp' (reference 'sync'), algo.sync_every=3 (reference None)"


def test_a_reference_of_three_seeds_gives_no_verdict():
    """Olympic statistics of 3 reference seeds leave one: no standard deviation, a bound at that seed's
    epochs (a run at the epochs of another reference seed was flagged 'faster'); 4 give a verdict."""
    def ref(epochs):
        return {"seeds": [{"seed": i + 1, "epochs": {"10": e}} for i, e in enumerate(epochs)]}

    got = rcp.check(ref([9, 8, 9]), 10.0, [8], 0)
    assert got["check"] == "reference too small: 3 seeds reached 10 (4 needed)"
    four = rcp.check(ref([9, 8, 9, 9]), 10.0, [9], 0)
    assert four["check"] == rcp.OK and four["RCP stdev"] == four["RCP stdev"]  # a number, not NaN
