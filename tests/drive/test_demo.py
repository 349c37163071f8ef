"""The demo picks the machine's preset (gpu with CUDA, else cpu) and says so; --preset wins."""
import os
from pathlib import Path

import pytest
import torch

from speechperf.drive import demo
from speechperf.config import load_preset, preset_names
from speechperf.models import build_model
from speechperf.results.workload import workload


class Stop(Exception):
    pass


@pytest.fixture
def synth_calls(monkeypatch):
    calls = []

    def fake(out, hours, seed, progress):
        calls.append(hours)
        raise Stop  # the choice is made before synthesis: nothing more to run

    monkeypatch.setattr("speechperf.corpus.synth.synthesize", fake)
    return calls


def test_pick_preset():
    assert demo.pick_preset(cuda=False) == ("cpu", "no CUDA device")


@pytest.mark.parametrize("cuda,want,hours", [(False, "cpu", 1.5), (True, "gpu", 8.0)])
def test_demo_picks_and_says_its_preset(cuda, want, hours, monkeypatch, synth_calls, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Fake H100")
    with pytest.raises(Stop):
        demo.run_demo(tmp_path / "d")
    out = capsys.readouterr().out
    assert f"[demo] preset {want!r} (" in out and "--preset overrides" in out
    assert ("'Fake H100' found" in out) == cuda
    assert synth_calls == [hours]


def test_preset_option_overrides_the_pick(monkeypatch, synth_calls, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(Stop):
        demo.run_demo(tmp_path / "d", preset="cpu")
    out = capsys.readouterr().out
    assert "[demo] preset 'cpu' (given): workload ds2, " in out and "--preset overrides" not in out
    assert synth_calls == [1.5]


@pytest.mark.parametrize("preset", preset_names())
def test_every_preset_runs_and_the_demo_names_it_and_its_workload(preset, synth_calls, tmp_path, capsys):
    """Any preset (those added later too) passes the demo's per-preset choices up to synthesis,
    and the demo says which preset, which model with how many parameters, and how much audio."""
    with pytest.raises(Stop):
        demo.run_demo(tmp_path / "d", preset=preset)
    cfg = load_preset(preset)
    w = workload(cfg.to_dict())
    assert w["model"] == cfg.model.name and w["params"] == sum(p.numel() for p in build_model(cfg.model).parameters())
    hours = demo.PRESET_HOURS.get(preset, demo.DEFAULT_HOURS)
    line = f"[demo] preset {preset!r} (given): workload {cfg.model.name}, {w['params'] / 1e6:.3g} M params, {hours:g} h"
    assert line in capsys.readouterr().out and synth_calls == [hours]


def test_demo_seeds_layout_and_one_seed_line(tiny_features, monkeypatch, tmp_path, capsys):
    """--seeds 2 --parallel 2: seed 1 in DIR/run (where a one-seed demo keeps it), seed 2 in DIR/run-seed-2,
    the TTA rows and the report cover both as one group; run again without --seeds, the demo
    reads DIR/run as it is and says what one seed cannot tell."""
    import csv
    import json
    import shutil

    monkeypatch.setattr("speechperf.corpus.synth.synthesize", lambda out, hours, seed, progress: None)
    monkeypatch.setattr("speechperf.features.prepare.prepare",
                        lambda corpus, out, progress: out.exists() or shutil.copytree(tiny_features, out))
    swept = []
    monkeypatch.setattr(demo, "_beam_sweep", lambda run, say: swept.append(run))  # Table 3: not what this tests
    out = tmp_path / "d"
    args = dict(preset="tiny", overrides=["threads=1", "max_epochs=1"])
    # side by side (drive/seed_slots.py: each seed a `speechperf train` process) in the demo's layout
    rows = demo.run_demo(out, seeds=(1, 2), parallel=2 if len(os.sched_getaffinity(0)) >= 2 else 1, **args)
    for folder, seed in (("run", 1), ("run-seed-2", 2)):
        assert json.loads((out / folder / "config.json").read_text())["train"]["seed"] == seed
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("run")) == ["run", "run-seed-2"]
    assert len({r["run"] for r in rows}) == 2 and swept == [out / "run"]
    with open(out / "report" / "repeated.csv", newline="") as f:
        assert {r["runs"] for r in csv.DictReader(f)} == {"2"}  # the two seeds, one group
    assert "one seed:" not in capsys.readouterr().out

    mtime = (out / "run" / "results.db").stat().st_mtime_ns
    rows = demo.run_demo(out, sweep=False, **args)  # `demo --no-sweep`: the report, no beam sweep
    text = capsys.readouterr().out
    said = " ".join(text.split())  # lines wrapped at 100 columns (a long run path moves the break)
    assert "already finished" in said and "[demo] one seed: " in said and "--seeds 5" in said
    assert max(map(len, text.splitlines())) <= 100  # every line the demo says, wrapped
    assert "(the tiny preset's reference: 4 to 5 epochs to CER 38 over 5 seeds)" in demo.one_seed("tiny")
    assert "(the cpu preset's reference: 8 to 9 epochs to CER 10 over 5 seeds)" in demo.one_seed("cpu")
    assert "reference" not in demo.one_seed("gpu")  # none recorded: no spread to cite
    assert len({r["run"] for r in rows}) == 1 and (out / "run" / "results.db").stat().st_mtime_ns == mtime
    assert swept == [out / "run"] and "report: " in said


def test_no_sweep_option_reaches_the_demo(monkeypatch):
    from speechperf.cli import main

    got = {}
    monkeypatch.setattr(demo, "run_demo", lambda out, **kw: got.update(kw) or [])
    assert main(["demo", "--out", "x", "--no-sweep", "--json"]) == 0 and got["sweep"] is False
    assert main(["demo", "--out", "x", "--json"]) == 0 and got["sweep"] is True


GPU_DEMO = Path(__file__).parents[1] / "benchmarks/fixtures/gpu_check/runs/demo/run"  # a recorded H200 demo run


def _demo_rows(runs, targets="paper", epochs=3):
    """The rows run_demo returns: CER then WER, a row per run and target."""
    from speechperf.studies.tta import tta_table

    return [row for m in ("cer", "wer") for row in tta_table(runs, metric=m, targets=targets if m == "cer" else "paper",
                                                             epochs=epochs)]


def test_the_demo_ends_in_five_lines_on_a_recorded_run():
    """The H200 demo run reached every paper target: the tightest CER one is its TTA."""
    lines = demo.summary(_demo_rows([GPU_DEMO]), Path("demo/report/index.html"))
    assert lines == ["timed: ds2, 25.6 M params on H200x1, to CER 10/8/7, WER 22/20.2/19.2 (1 run)",
                     "TTA: CER 7 in 1.93 min (12 epochs; error 5.87 [5.61, 6.17])",
                     "where it went: steps 65%, eval 20%, data 9%, ckpt 5%, epoch 1%",
                     "efficiency: MFU 3.92%, 38.8 TFLOPS; to accuracy: $0.15",
                     "report: demo/report/index.html"]


def test_the_demo_ending_of_a_run_short_of_its_target_says_what_to_do(tiny_run):
    lines = demo.summary(_demo_rows([tiny_run, GPU_DEMO]), Path("report/index.html"))
    assert len(lines) == 5 and max(map(len, lines)) <= 100
    assert lines[0].endswith("(2 runs)") and "tiny" not in lines[0]  # the first run's workload, and how many
    assert lines[1] == "TTA: CER 10 not reached: train longer (--minutes) or on more audio (--hours)"
    assert lines[2].startswith("where it went: ") and lines[2].endswith(" (to the last evaluation)")
    # every part, the largest first: which one leads is the tiny run's timing (its steps and its checkpoints
    # every 5 steps take about as long since the CTC loss got fast), so the order is checked, not a name
    parts = [p.split() for p in lines[2][len("where it went: "):-len(" (to the last evaluation)")].split(", ")]
    assert sorted(name for name, _ in parts) == ["ckpt", "data", "epoch", "eval", "steps"]
    shares = [int(pct.rstrip("%")) for _, pct in parts]
    assert shares == sorted(shares, reverse=True) and 95 <= sum(shares) <= 102
    assert lines[3].endswith("to accuracy: none: unreached")
    reached = demo.summary(_demo_rows([tiny_run], targets="90", epochs=1), Path("r"))[1]
    assert reached.startswith("TTA: CER 90 in ") and "(1 epoch; error " in reached


def test_the_demo_command_prints_the_narrow_table_then_the_ending(monkeypatch, capsys):
    from speechperf.cli import main

    monkeypatch.setattr(demo, "run_demo", lambda out, **kw: _demo_rows([GPU_DEMO]))
    assert main(["demo", "--out", "d"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["run", "target"] and max(map(len, lines)) <= 100
    assert lines[-5].startswith("timed: ") and lines[-1] == "report: d/report/index.html"
    assert main(["demo", "--out", "d", "--wide"]) == 0
    assert "time parts" in capsys.readouterr().out.splitlines()[0]
