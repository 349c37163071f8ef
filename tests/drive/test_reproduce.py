"""The whole ISA cap (its three variables, seen by a child's torch and MKL), a run stopped
after N epochs keeps its schedule, and ``speechperf reproduce`` against the reference curves:
identical on the test suite's tiny corpus, refused without curves, "cannot be compared"
(not "differs"), with what differs and what to do, for another torch, build, thread count,
corpus or preparation.

The tests that reproduce tiny.json's test curve need what that curve was measured with: an
x86 CPU (the cap's instruction sets), the same torch (its kernels) and the same numpy (it
synthesizes the test corpus); elsewhere they skip, naming the difference."""
import json
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata

import numpy as np
import pytest

from speechperf.cli import main
from speechperf.features.checksum import features_sha256
from speechperf.studies import curve, rcp
from speechperf.hardware import isa_cap
from speechperf.drive import reproduce as rep

HAS_AVX2 = "avx2" in open("/proc/cpuinfo").read() if sys.platform == "linux" else False
TEST_CORPUS = {"hours": 0.03, "seed": 3}  # conftest.py's tiny corpus, as tiny.json's test curve names it


def _not_the_reference_stack() -> str | None:
    """Why this machine cannot reproduce tiny.json's test curve (None: it can)."""
    if not HAS_AVX2 or platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the reference curves are x86 AVX2 curves; this machine: {platform.machine()}, AVX2 {HAS_AVX2}"
    ref = rcp.load_reference("tiny")
    vendor = rep._vendor()
    made = next((c["settings"] for s in ref["seeds"] for c in s.get("curves", [])
                 if (c.get("corpus") or {}).get("synth") == TEST_CORPUS and c["settings"].get("cpu_vendor") == vendor), None)
    if made is None:
        return f"tiny.json has no curve on the test suite's corpus made on a CPU of this maker ({vendor})"
    for name, here in (("torch", metadata.version("torch")), ("numpy", np.__version__)):
        if made.get(name) and made[name] != here:
            return f"{name} {here} here, {made[name]} in tiny.json's test curve: another {name} computes otherwise"
    return None


NOT_THE_REFERENCE_STACK = _not_the_reference_stack()
needs_reference_stack = pytest.mark.skipif(NOT_THE_REFERENCE_STACK is not None, reason=str(NOT_THE_REFERENCE_STACK))


def child_effective(env: dict) -> dict:
    code = "import json; from speechperf.hardware.isa_cap import effective; print(json.dumps(effective()))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.skipif(not HAS_AVX2, reason="the AVX2 cap needs a CPU with AVX2")
def test_the_avx2_cap_sets_its_variables_and_a_childs_torch_runs_avx2_and_mkls_compatible_path():
    env = isa_cap.cap_env("avx2", {k: v for k, v in os.environ.items() if k not in isa_cap.CAP_VARS})
    assert (env["ONEDNN_MAX_CPU_ISA"], env["ATEN_CPU_CAPABILITY"], env["MKL_CBWR"]) == ("AVX2", "avx2", "COMPATIBLE")
    got = child_effective(env)
    assert got["cpu_capability"] == "AVX2" and got["cap"] == "avx2" and got["MKL_CBWR"] == "COMPATIBLE"
    assert got["onednn_isa"] is None or "AVX2" in got["onednn_isa"]
    import torch

    assert (got["mkl"] is not None) == torch.backends.mkl.is_available()
    # a cap without MKL's variable is a part of one: a run under it is not the reference's
    assert isa_cap.cap_of({isa_cap.ONEDNN_VAR: "AVX2", isa_cap.ATEN_VAR: "avx2"}).startswith("partial: ")


def test_a_cap_reaches_both_dispatchers_of_a_child(monkeypatch):
    """A cap below the machine's (SSE4.1: on every x86-64 CPU torch runs on) shows that both
    variables reach the child's torch: ATen's capability drops to DEFAULT, oneDNN's to SSE4.1."""
    import os

    monkeypatch.setitem(isa_cap.CAPS, "sse41", {isa_cap.ONEDNN_VAR: "SSE41", isa_cap.ATEN_VAR: "default"})
    got = child_effective(isa_cap.cap_env("sse41", dict(os.environ)))
    assert got["cpu_capability"] == "DEFAULT"
    assert (got["ONEDNN_MAX_CPU_ISA"], got["ATEN_CPU_CAPABILITY"]) == ("SSE41", "default")
    assert got["onednn_isa"] in (None, "Intel SSE4.1")
    half = isa_cap.cap_of({isa_cap.ONEDNN_VAR: "AVX2"})  # bench_convergence's old --isa: half a cap
    assert half == "partial: ONEDNN_MAX_CPU_ISA=AVX2"
    with pytest.raises(isa_cap.UnknownCap, match="unknown ISA cap 'avx9'"):
        isa_cap.cap_vars("avx9")


def test_env_json_records_the_kernels():
    from speechperf.hardware.environment import capture_env

    isa = capture_env()["isa"]
    assert set(isa) >= {"cpu_capability", "onednn_isa", "onednn", "mkl", "cap", "ONEDNN_MAX_CPU_ISA",
                        "ATEN_CPU_CAPABILITY", "MKL_CBWR"}
    import torch

    assert isa["cpu_capability"] == torch.backends.cpu.get_cpu_capability()


def test_the_cpu_maker_is_read_from_the_model_name():
    assert curve.cpu_vendor("AMD EPYC 7B13") == "AMD"
    assert curve.cpu_vendor("Intel(R) Xeon(R) Processor") == "Intel"
    assert curve.cpu_vendor("Intel(R) Xeon(R) Platinum 8480+") == "Intel"
    assert curve.cpu_vendor("Neoverse-V2") is None and curve.cpu_vendor(None) is None


def test_a_curve_of_this_maker_is_picked_before_another_makers():
    def c(vendor, sha="f"):
        return {"settings": {"features_sha256": sha, "cpu_vendor": vendor}, "epochs": []}

    ref = {"seeds": [{"seed": 1, "curves": [c("AMD"), c("Intel"), c("Intel", "g")]}]}
    assert curve.pick(ref, 1, "f", "Intel") is ref["seeds"][0]["curves"][1]
    assert curve.pick(ref, 1, "f", "AMD") is ref["seeds"][0]["curves"][0]
    assert curve.pick(ref, 1, "f", None) is ref["seeds"][0]["curves"][0]  # another maker's: comparable() names it
    assert curve.pick(ref, 1, "h", "AMD") is None
    mine = {"threads": 1, "cap": "avx2", "cpu_vendor": "Intel", "torch": "t", "MKL_CBWR": "COMPATIBLE",
            "cpu_capability": "AVX2", "features_sha256": "f", "seed": 1}
    assert curve.comparable(mine, {**mine, "cpu_vendor": "AMD"}) == "cpu_vendor Intel (reference AMD)"
    assert curve.comparable(mine, dict(mine)) is None


def test_a_curve_is_reproduced_with_its_own_optimizer_step():
    """train.optim.impl stays out of a reference's recipe (the same training) but sums in another
    order: a curve records it, a run with another is not comparable, and reproduce trains with the
    curve's, whatever the preset says now; a curve recorded before the field had torch's default."""
    config = {"train": {"seed": 1, "system": {"threads": 1}, "optim": {"impl": "fused"}}}
    assert curve.settings_of(config, {})["optim_impl"] == "fused"
    assert curve.settings_of({"train": {"seed": 1}}, {})["optim_impl"] == "default"
    mine = {"threads": 1, "cap": "avx2", "cpu_vendor": "Intel", "torch": "t", "MKL_CBWR": "COMPATIBLE",
            "cpu_capability": "AVX2", "features_sha256": "f", "seed": 1, "optim_impl": "fused"}
    old = {k: v for k, v in mine.items() if k != "optim_impl"}
    assert curve.setting(old, "optim_impl") == "default" and curve.setting(mine, "optim_impl") == "fused"
    assert curve.comparable(mine, old) == "optim_impl fused (reference default)"
    assert curve.comparable({**mine, "optim_impl": "default"}, old) is None
    cmd = rep.child_command("cpu", "F", 1, 2, "O", ["train.optim.impl=foreach"], kernels=curve.forced(mine))
    assert cmd.index("train.optim.impl=fused") > cmd.index("train.optim.impl=foreach")  # the later one wins
    assert "train.system.ctc_kernel=torch" in cmd  # a curve from before the kernel: torch's CTC
    assert not any(a.startswith("train.optim.impl") for a in rep.child_command("cpu", "F", 1, 2, "O", []))
    for preset in ("tiny", "cpu", "conformer-cpu", "transducer-cpu"):  # every stored curve says which step made it
        for s in rcp.load_reference(preset)["seeds"]:
            for c in s.get("curves") or []:
                assert c["settings"]["optim_impl"] in ("default", "foreach", "fused"), (preset, s["seed"])
    tr = rcp.load_reference("transducer-cpu")["seeds"][0]["curves"][0]
    assert tr["settings"]["optim_impl"] == "fused"  # recorded by the preset's fused step before the field existed


def test_compare_names_the_first_epoch_that_differs():
    ref = [{"epoch": 1, "loss": 2.0, "cer": 50.0, "wer": 90.0}, {"epoch": 2, "loss": 1.5, "cer": 30.0, "wer": 70.0}]
    assert curve.compare(ref, ref)["verdict"] == curve.IDENTICAL
    mine = [ref[0], {**ref[1], "cer": 30.000000000000004}]
    got = curve.compare(mine, ref)
    assert got["verdict"] == curve.DIFFERS and got["first"]["epoch"] == 2
    assert got["text"].startswith("differs from epoch 2: CER 30.000000000000004 vs 30.0")
    assert curve.compare(mine, ref, epochs=1)["verdict"] == curve.IDENTICAL


def _train(features, out, **over):
    from speechperf.train.loop import TrainRequest, train

    sets = {"train.schedule.name": "cosine", "train.stop.max_epochs": 2, "train.eval.final_splits": "none", "train.system.threads": 1,
            **over}
    train(TrainRequest(preset="tiny", data=features, out=out, overrides=[f"{k}={v}" for k, v in sets.items()], quiet=True))
    from speechperf.results.view import RunView

    with RunView.open(out) as run:
        return curve.curve_of(run.rows.evals())


def test_stop_after_epochs_keeps_the_schedule(tiny_features, tmp_path):
    """A cosine's length is max_epochs: a run cut to 1 epoch by stop_after_epochs trains the
    first epoch of the full run, one with max_epochs=1 does not."""
    full = _train(tiny_features, tmp_path / "full")
    cut = _train(tiny_features, tmp_path / "cut", **{"train.stop.after_epochs": 1})
    short = _train(tiny_features, tmp_path / "short", **{"train.stop.max_epochs": 1})
    assert len(full) == 2 and len(cut) == 1
    assert cut[0] == full[0]
    assert short[0] != full[0]


@pytest.fixture(scope="module")
def reproduced(tiny_features, tmp_path_factory):
    """``speechperf reproduce tiny`` on the test suite's corpus (the one tiny.json's test curve
    was measured on: synth 0.03 h seed 3, conftest.py), its run kept."""
    out = tmp_path_factory.mktemp("reproduce") / "run"
    code = main(["reproduce", "tiny", "--data", str(tiny_features), "--out", str(out), "--json"])
    return code, out


@needs_reference_stack
def test_reproduce_tiny_is_identical(reproduced, tiny_features, capsys):
    code, out = reproduced
    ref = rcp.load_reference("tiny")
    assert curve.pick(ref, 1, features_sha256(tiny_features)) is not None, \
        "tiny.json has no curve on the test suite's corpus (conftest.py's synth 0.03 h seed 3)"
    assert code == 0
    env = json.loads((out / "env.json").read_text())
    assert env["isa"]["cap"] == "avx2" and env["isa"]["ATEN_CPU_CAPABILITY"] == "avx2"
    assert env["isa"]["MKL_CBWR"] == "COMPATIBLE"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["convergence"]["reproduction"]["text"] == "reproduces the reference bit for bit through epoch 2"


@needs_reference_stack
def test_another_torch_or_thread_count_cannot_be_compared(reproduced, tmp_path, tiny_features):
    _, out = reproduced
    ref = rcp.load_reference("tiny")
    chosen = curve.pick(ref, 1, features_sha256(tiny_features), rep._vendor())
    assert rep.judge(out, ref, chosen, 2)["verdict"] == curve.IDENTICAL
    maker = {"AMD": "Intel", "Intel": "AMD"}[rep._vendor()]  # the other maker's curve: named, never "differs"
    theirs = curve.pick(ref, 1, features_sha256(tiny_features), maker)
    if theirs is not None and theirs["settings"].get("cpu_vendor") == maker:
        got = rep.judge(out, ref, theirs, 2)
        assert got["verdict"] == curve.NOT_COMPARABLE and f"cpu_vendor {rep._vendor()} (reference {maker})" in got["text"]
    other = tmp_path / "torch"
    shutil.copytree(out, other)
    env = json.loads((other / "env.json").read_text())
    env["libraries"]["torch"] = "2.0.0+cpu"
    (other / "env.json").write_text(json.dumps(env))
    got = rep.judge(other, ref, chosen, 2)
    assert got["verdict"] == curve.NOT_COMPARABLE and "torch 2.0.0+cpu (reference 2.13.0+cpu)" in got["text"]
    threads = tmp_path / "threads"
    shutil.copytree(out, threads)
    config = json.loads((threads / "config.json").read_text())
    config["train"]["system"]["threads"] = 2
    (threads / "config.json").write_text(json.dumps(config))
    got = rep.judge(threads, ref, chosen, 2)
    assert got["verdict"] == curve.NOT_COMPARABLE and got["text"].startswith("cannot be compared: ran on 2 threads; rerun with --isa ")


@needs_reference_stack
def test_another_torch_here_is_not_trained(monkeypatch, tiny_features, capsys):
    monkeypatch.setattr(rep.metadata, "version", lambda name: "2.0.0")
    assert main(["reproduce", "tiny", "--data", str(tiny_features)]) == rep.EXIT[curve.NOT_COMPARABLE] == 3
    assert "cannot be compared: torch 2.0.0" in capsys.readouterr().out


def test_a_reference_without_curves_is_refused(monkeypatch, tmp_path, tiny_features, capsys):
    ref = json.loads(rcp.reference_path("tiny").read_text())
    for seed in ref["seeds"]:
        seed.pop("curves", None)
    (tmp_path / "tiny.json").write_text(json.dumps(ref))
    monkeypatch.setattr(rcp, "RCP_DIR", tmp_path)
    assert main(["reproduce", "tiny", "--data", str(tiny_features)]) == 2
    err = capsys.readouterr().err
    assert "tiny.json has no reference curves" in err and "--curves 2" in err


@pytest.mark.parametrize("change,says", [(lambda r: r.pop("preset"), "field 'preset' should be 'tiny', found None"),
                                         (lambda r: r.update(preset="cpu"), "field 'preset' should be 'tiny', found 'cpu'"),
                                         (lambda r: r.pop("recipe"), "field 'recipe' should be the reference's "
                                                                     "training settings"),
                                         # issue 61: each trained 2 epochs and ended "not comparable" (exit 3)
                                         (lambda r: r["recipe"].update({"train.lr": "fast"}),  # the file's own (flat) key
                                          "field 'recipe' is not a configuration this release trains: [train.optim] lr = "
                                          "'fast': expected float"),
                                         (lambda r: r["recipe"].update({"train.no_such_field": 1}),
                                          "[train] unknown keys ['no_such_field']"),
                                         (lambda r: r["recipe"].update({"nosuch.x": 1}),
                                          "field 'recipe.nosuch.x' is not a configuration field"),
                                         (lambda r: r["recipe"].update({"train.optim.lr": -1.0}), "train.optim.lr"),
                                         (lambda r: r["seeds"][0]["curves"][0]["settings"].update(threads="one"),
                                          "field 'seeds[0].curves[0].settings.threads' should be a whole number"),
                                         (lambda r: r.update(overrides=["train.optim.lr=fast"]),
                                          "field 'overrides' is not a configuration this release trains: override "
                                          "'train.optim.lr=fast'")])
def test_a_reference_of_another_preset_or_without_its_recipe_is_refused(monkeypatch, tmp_path, tiny_features, capsys,
                                                                         change, says):
    """Issue 48: a reference naming no preset or another one reproduced as "identical" (exit 0);
    one without its recipe was "not comparable" (exit 3)."""
    ref = json.loads(rcp.reference_path("tiny").read_text())
    change(ref)
    (tmp_path / "tiny.json").write_text(json.dumps(ref))
    monkeypatch.setattr(rcp, "RCP_DIR", tmp_path)
    monkeypatch.setattr(rep, "_train", lambda *a, **k: pytest.fail("trained on a reference it should refuse"))
    assert main(["reproduce", "tiny", "--data", str(tiny_features)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path / 'tiny.json'}: " in err and says in err, err


def test_features_of_another_corpus_cannot_be_compared(tmp_path, tiny_features, capsys):
    other = tmp_path / "features"
    shutil.copytree(tiny_features, other)
    stats = json.loads((other / "stats.json").read_text())
    stats["frames"] += 1
    (other / "stats.json").write_text(json.dumps(stats))
    assert main(["reproduce", "tiny", "--data", str(other)]) == 3
    assert "another corpus or preparation" in capsys.readouterr().out


@needs_reference_stack
def test_units_another_run_trained_into_the_folder_leave_a_character_curve_comparable(tmp_path, tiny_features):
    """A transducer run at loader.units=bpe:N writes FEATS/units/bpe-N.json beside the features: a
    character reference's curve is still the one of these features (its checksum covers its own units)."""
    other = tmp_path / "features"
    shutil.copytree(tiny_features, other)
    ref = rcp.load_reference("tiny")
    before, _ = rep._curve_for(ref, 1, other, None, True)
    assert isinstance(before, dict)
    (other / "units").mkdir(exist_ok=True)
    (other / "units" / "bpe-64.json").write_text('{"sha256": "x"}')
    assert features_sha256(other) != features_sha256(other, "char")  # the whole folder's checksum moved
    after, _ = rep._curve_for(ref, 1, other, None, True)
    assert after is before


def test_features_prepared_by_a_cpu_dependent_speechperf_are_named(tmp_path, tiny_features, capsys):
    """Features from a prepare without made_with (float32 features, whose float16 values followed
    MKL's kernels on that CPU): the answer names that and the next step, prepare again."""
    old = tmp_path / "features"
    shutil.copytree(tiny_features, old)
    config = json.loads((old / "features.json").read_text())
    config.pop("made_with")
    (old / "features.json").write_text(json.dumps(config))
    stats = json.loads((old / "stats.json").read_text())
    stats["frames"] += 1  # its values differ from the reference's
    (old / "stats.json").write_text(json.dumps(stats))
    assert main(["reproduce", "tiny", "--data", str(old)]) == 3
    out = " ".join(capsys.readouterr().out.split())  # the verdict wrapped at 100 columns
    assert "prepared without made_with in features.json" in out and "reproduce --prepare CORPUS" in out


def test_another_build_of_the_reference_torch_release_is_named_with_the_wheel_to_install():
    got = rep.torch_differs("2.13.0+cu130", "2.13.0+cpu")
    assert got.startswith("torch 2.13.0+cu130 is the reference's release 2.13.0 in another build "
                          "(reference 2.13.0+cpu)")
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in got
    assert rep.torch_differs("2.11.0", "2.13.0+cpu").startswith("torch 2.11.0 (reference 2.13.0+cpu): another release")
    assert rep.torch_differs("2.13.0+cpu", "2.13.0+cpu") is None


@needs_reference_stack
def test_tta_says_the_run_reproduces_the_reference_and_flags_one_that_differs(reproduced, tmp_path):
    from speechperf.studies.study import tta_study

    _, out = reproduced
    rows = tta_study([out], metric="cer", targets="38")["runs"]
    assert rows[0]["reproduction"] == "reproduces the reference bit for bit through epoch 2"
    from speechperf.drive import demo

    said = []
    demo._say_reproduction([out], said.append)  # the demo's closing lines
    assert said == ["run: reproduces the reference bit for bit through epoch 2"]
    assert not rows[0]["RCP check"].startswith("FAILED")
    other = tmp_path / "differs"  # the same run, its second evaluation one bit off: could have matched, did not
    shutil.copytree(out, other)
    import sqlite3

    with sqlite3.connect(other / "results.db") as db:
        db.execute("UPDATE evals SET cer = cer + 1e-9 WHERE epoch = 2")
    rows = tta_study([other], metric="cer", targets="38")["runs"]
    assert rows[0]["reproduction"].startswith("FAILED: could have reproduced the reference curve and differs from epoch 2")
    assert rows[0]["RCP check"].startswith("FAILED")


def test_a_run_cut_after_its_first_epochs_is_unfinished_not_failed():
    from speechperf.studies.aggregate import SeedRun, outcome

    def run(cut):
        config = {"preset": "cpu", "train": {"seed": 1, "stop": {"max_epochs": 12, "after_epochs": cut}}}
        return SeedRun("r", "w", "m", config, "success", ((60.0, 50.0), (120.0, 30.0)))

    assert outcome(run(2), 10.0, 3).state == "unfinished"
    assert outcome(run(0), 10.0, 3).state == "never reached"


def test_features_of_a_corpus_with_other_utterance_counts_name_the_corpus_to_make(tmp_path, tiny_features, capsys):
    other = tmp_path / "features"
    shutil.copytree(tiny_features, other)
    index = json.loads((other / "train-clean" / "index.json").read_text())
    index["utterances"] = index["utterances"][:-1]  # one utterance fewer than any reference trained on
    (other / "train-clean" / "index.json").write_text(json.dumps(index))
    assert main(["reproduce", "tiny", "--data", str(other)]) == 3
    out = " ".join(capsys.readouterr().out.split())  # the words, wherever the 100-column wrap breaks the lines
    assert "another corpus (training utterances " in out and f"train-clean {len(index['utterances'])}" in out
    assert "speechperf corpus synth --hours" in out and "reproduce --prepare CORPUS" in out


@needs_reference_stack
def test_prepare_corpus_makes_features_of_the_reference_curve(tmp_path, tiny_corpus, tiny_features):
    """``reproduce --prepare CORPUS`` where --data matches no curve: CORPUS is prepared into
    DATA-reproduce, whose features are the reference curve's."""
    stale = tmp_path / "features"
    shutil.copytree(tiny_features, stale)
    stats = json.loads((stale / "stats.json").read_text())
    stats["frames"] += 1
    (stale / "stats.json").write_text(json.dumps(stats))
    ref = rcp.load_reference("tiny")
    chosen, data = rep._curve_for(ref, 1, stale, tiny_corpus, quiet=True)
    assert data == tmp_path / "features-reproduce"
    assert chosen is curve.pick(ref, 1, features_sha256(tiny_features), rep._vendor())


@needs_reference_stack
@pytest.mark.timeout(300)
def test_a_sigterm_to_its_group_stops_reproduce_and_removes_its_temporary_run(tiny_features, tmp_path):
    """The scheduler's SIGTERM to the group (reproduce and its training child): exit 143, said, and the
    temporary run folder (its checkpoint, database) removed, not left in the temporary directory."""
    import os

    from tests.conftest import cli_start, sigterm_when_ready

    p = cli_start("reproduce", "tiny", "--data", tiny_features, session=True, fresh=True,  # its own TMPDIR
                  env={**os.environ, "TMPDIR": str(tmp_path)})
    rc, err = sigterm_when_ready(p, lambda: bool(list(tmp_path.glob("reproduce-tiny-*/run.json"))), timeout=180)
    assert rc == 143, err[-2000:]
    assert "speechperf: error: stopped by SIGTERM" in err and "Traceback" not in err
    assert not list(tmp_path.glob("reproduce-tiny-*"))
    with pytest.raises(ProcessLookupError):
        os.killpg(p.pid, 0)  # its training child stopped too
