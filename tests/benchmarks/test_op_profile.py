"""benchmarks/_op_profile.py: per-step figures from a profiler trace, on a hand-built trace of two
steps (exact sums, sites, counts), and the step_profile benchmark (benchmarks/run.py) on the tiny corpus's
features on this CPU (real profiler events through the same functions; device columns n/a)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from torch.autograd import DeviceType
from torch.autograd.profiler_util import EventList, FunctionEvent

from tests.conftest import run_benchmark

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
spec = importlib.util.spec_from_file_location("_op_profile", ROOT / "benchmarks" / "_op_profile.py")
op = importlib.util.module_from_spec(spec)
spec.loader.exec_module(op)
CUDA = DeviceType.CUDA


def ev(name, start, end, thread=1, device=DeviceType.CPU, activity=None):
    return FunctionEvent(id=0, name=name, thread=thread, start_us=start, end_us=end, device_type=device,
                         activity_type=activity)


def trace() -> EventList:
    """Two marked steps of 1000 us on the main thread (1), the backward's ops on the autograd
    thread (2). Step 1: aten::ctc_loss (100 us) holds a copy_ that launches and waits 30 us in a
    cudaStreamSynchronize; aten::item waits 20 us in another. Step 2: aten::item again (12 us
    wait). Backward: aten::_ctc_loss_backward (60 us) with its own sync (6 us) and a launch. Outside the
    steps: the sync that closes the timed window. Device: 3 kernels (400 + 200 + 100 us); a Memcpy,
    a device-side sync and the first step's range on the device's timeline, which are no kernels."""
    events = [
        ev("speechperf::train_step", 0, 1000),
        ev("aten::ctc_loss", 100, 200), ev("aten::copy_", 110, 150), ev("cudaLaunchKernel", 112, 115),
        ev("cudaStreamSynchronize", 115, 145),
        ev("aten::item", 300, 330), ev("aten::_local_scalar_dense", 302, 328), ev("cudaStreamSynchronize", 305, 325),
        ev("aten::_ctc_loss_backward", 500, 560, thread=2), ev("cudaLaunchKernelExC", 505, 509, thread=2),
        ev("cudaStreamSynchronize", 520, 526, thread=2),
        ev("speechperf::train_step", 1000, 2000),
        ev("aten::item", 1100, 1120), ev("cudaStreamSynchronize", 1105, 1117),
        ev("cudaDeviceSynchronize", 2100, 2900),  # the window's closing torch.cuda.synchronize(): no step's
        ev("ctc_loss_log_alpha_gpu_kernel", 200, 600, thread=9, device=CUDA, activity="kernel"),
        ev("elementwise_kernel", 600, 800, thread=9, device=CUDA, activity="kernel"),
        ev("elementwise_kernel", 1200, 1300, thread=9, device=CUDA, activity="kernel"),
        ev("Memcpy DtoH (Device -> Pageable)", 320, 322, thread=9, device=CUDA, activity="gpu_memcpy"),
        ev("Stream Sync", 140, 145, thread=9, device=CUDA, activity="cuda_sync"),
        ev("speechperf::train_step", 150, 3000, thread=9, device=CUDA, activity="gpu_user_annotation"),
    ]
    out = EventList(events)
    out._build_tree()  # the parents by time on each thread, as the profiler builds them
    return out


def test_a_two_step_trace_per_step():
    t = op.phase_tables("train step", trace(), steps=2, wall_s=0.0012, ref_s=0.001, cuda=True)
    assert t["row"] == {
        "phase": "train step", "unprofiled ms": 1.0, "profiled ms": 1.2,
        "host ops ms": 0.105,  # (100 + 30 + 60 + 20) us of top-level aten ops / 2 steps
        "sync wait ms": 0.034,  # (30 + 20 + 6 + 12) / 2; the closing 800 us sync is outside the steps
        "kernel ms": 0.35, "busy %": 35.0,  # 700 us of kernels / 2 steps / 1 ms unprofiled
        "kernels": 1.5, "launches": 1.0, "syncs": 2.0,
        "top sync site": "aten::ctc_loss > aten::copy_ (cudaStreamSynchronize)"}  # one each: the longest wait
    assert t["syncs"] == [
        {"site": "aten::ctc_loss > aten::copy_", "call": "cudaStreamSynchronize", "per step": 0.5, "wait ms": 0.015},
        {"site": "aten::item > aten::_local_scalar_dense", "call": "cudaStreamSynchronize", "per step": 0.5,
         "wait ms": 0.01},
        {"site": "aten::item", "call": "cudaStreamSynchronize", "per step": 0.5, "wait ms": 0.006},
        {"site": "aten::_ctc_loss_backward", "call": "cudaStreamSynchronize", "per step": 0.5, "wait ms": 0.003}]
    assert t["kernels"] == [
        {"kernel": "ctc_loss_log_alpha_gpu_kernel", "calls": 0.5, "device ms": 0.2},
        {"kernel": "elementwise_kernel", "calls": 1.0, "device ms": 0.15}]
    assert t["host ops"][:3] == [  # self time: the children's time taken out (ctc_loss 100 - its copy_'s 40)
        {"op": "cudaStreamSynchronize", "calls": 2.0, "self ms": 0.034},
        {"op": "aten::ctc_loss", "calls": 0.5, "self ms": 0.03},
        {"op": "aten::_ctc_loss_backward", "calls": 0.5, "self ms": 0.025}]


def test_a_sync_outside_every_aten_op_and_a_cpu_trace():
    events = EventList([ev("speechperf::evaluate", 0, 100), ev("cudaStreamSynchronize", 10, 20)])
    events._build_tree()
    assert op.sync_sites(op.host_events(events, op.windows(events)), 1)[0]["site"] == "(no aten op)"
    # without the profiler's activity types (an older trace): copies, fills and the ranges are no kernels by name
    named = [ev(n, 0, 1, device=CUDA) for n in ("k", "Memcpy HtoD", "Memset (Device)", "speechperf::train_step")]
    assert [op.is_kernel(e) for e in named] == [True, False, False, False]
    cpu = op.phase_tables("evaluation", trace(), steps=2, wall_s=0.0012, ref_s=0.001, cuda=False)
    assert cpu["syncs"] is None and cpu["kernels"] is None and cpu["row"]["host ops ms"] == 0.105
    assert [k for k, v in cpu["row"].items() if v is None] == ["sync wait ms", "kernel ms", "busy %", "kernels",
                                                                 "launches", "syncs", "top sync site"]


def test_the_benchmark_on_this_cpu(tiny_features, tmp_path, capsys):
    ledger = tmp_path / "ledger.jsonl"
    assert run_benchmark("--ledger", ledger, "step_profile", "--data", tiny_features, "--preset", "tiny", "--device", "cpu",
                         "--steps", "1", "--warmup", "1", "--json", "--trace", tmp_path / "t", "train.system.threads=1") == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.jsonl", "t-tiny-evaluation.json",
                                                          "t-tiny-loop_step.json", "t-tiny-train_step.json"]
    header, *out, ratio = capsys.readouterr().out.strip().split("\n")  # the goal, the JSON, the ratio
    assert header.startswith("== step_profile: docs/gpu.md: ") and ratio.startswith("step_profile: loop step / train")
    got = json.loads("\n".join(out))
    assert got["preset"] == "tiny" and got["head"].startswith("preset tiny: cpu (CPU), fp32, ")
    train, ev_ = got["phases"]["train step"], got["phases"]["evaluation"]
    assert train["row"]["kernel ms"] is None and train["row"]["unprofiled ms"] > 0
    assert 0 < train["row"]["host ops ms"] <= train["row"]["profiled ms"]
    names = [r["op"] for r in train["host ops"]]
    assert len(names) == 12 and "NumbaCTCLoss" in names  # the step's real ops (the CTC kernel by its Function), the marks left out
    assert not any(n.startswith(op.MARK) for n in names) and ev_["row"]["host ops ms"] > 0
    loop = got["phases"]["loop step"]  # the same step from a running loader: its ops, the reads between
    assert loop["row"]["unprofiled ms"] > 0 and "NumbaCTCLoss" in [r["op"] for r in loop["host ops"]]
    line = json.loads(ledger.read_text())  # the ledger's line: the ratio printed, the command given
    assert line["benchmark"] == "bench_step_profile" and line["command"].startswith("python benchmarks/run.py step_profile --data FEATS --preset tiny ")
    assert line["figures"]["ratio"] == loop["row"]["unprofiled ms"] / train["row"]["unprofiled ms"]
    assert line["figures"]["tiny"]["train step"]["ms"] == train["row"]["unprofiled ms"] and line["machine"]


def test_a_loop_step_that_runs_out_of_batches_says_how_many_it_needs(tiny_features, capsys):
    runner = importlib.import_module("run")
    # 10 batches of 4: enough for the train step's 3 + 4, not for the loop's 3 + 2 takes of 4 (a CPU's)
    with pytest.raises(SystemExit, match=r"gives 10 batches with these settings; the loop step needs 11 "):
        runner.main(["--no-ledger", "step_profile", "--data", str(tiny_features), "--preset", "tiny", "--device", "cpu",
                     "--steps", "4", "--warmup", "3", "train.system.threads=1"])


@pytest.mark.parametrize("args,says", [(["--preset", "tiny"], "is not a prepared features folder"),
                                       (["--preset", "tiny", "--steps", "0"], "need steps >= 1")])
def test_bad_input_exits_2_naming_it(tmp_path, tiny_features, args, says, capsys):
    runner = importlib.import_module("run")
    feats = tiny_features if "--steps" in args else tmp_path
    assert runner.main(["--no-ledger", "step_profile", "--data", str(feats), *args]) == 2
    assert says in capsys.readouterr().err
    assert runner.main(["--no-ledger", "step_profile", "--data", str(tiny_features), "--preset", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_the_printed_tables_are_what_the_check_summary_reads(capsys):
    """A GPU-form result (the two-step trace as both phases) printed as the check's log holds it, and
    read back by benchmarks/gpu_summary.py's profile row."""
    bench = importlib.import_module("bench_step_profile")
    gs_spec = importlib.util.spec_from_file_location("gpu_summary", ROOT / "benchmarks" / "gpu_summary.py")
    gs = importlib.util.module_from_spec(gs_spec)
    gs_spec.loader.exec_module(gs)
    train = op.phase_tables("train step", trace(), steps=2, wall_s=0.0012, ref_s=0.001, cuda=True)
    train["sync warnings"] = [{"python line": "speechperf/train/step.py:81", "per step": 1.0}]
    ev_ = {**op.phase_tables("evaluation", trace(), steps=2, wall_s=0.0012, ref_s=0.001, cuda=True),
           "sync warnings": []}
    ev_["row"]["phase"] = "evaluation"
    bench.show({"preset": "gpu", "head": "preset gpu: cuda:0 (H200)", "phases": {"train step": train,
                                                                                 "evaluation": ev_}})
    text = capsys.readouterr().out
    assert "-- train step: sync debug mode warnings by Python line (per step)" in text
    assert "speechperf/train/step.py:81" in text and "none: the debug mode warned of no call" in text
    assert "-- evaluation: top 8 kernels by device time (per pass)" in text
    assert gs.profile_figures(text) == (
        "gpu: train step: 2 syncs a step (top aten::ctc_loss > aten::copy_ (cudaStreamSynchronize)), GPU busy 35 %, "
        "1.5 kernels; 1 ms a step (1.2 profiled, 0.105 of it in host aten ops); evaluation: 2 syncs a pass (top "
        "aten::ctc_loss > aten::copy_ (cudaStreamSynchronize)), GPU busy 35 %, 1.5 kernels; 1 ms a pass (1.2 "
        "profiled, 0.105 of it in host aten ops)")


def test_a_kernel_is_told_by_name_where_the_events_carry_no_activity_type():
    """torch 2.11's FunctionEvent has no ``activity_type`` (the H200's torch): the name decides."""
    from types import SimpleNamespace
    old = lambda name: SimpleNamespace(name=name, device_type=CUDA)  # noqa: E731
    assert op.is_kernel(old("elementwise_kernel"))
    assert not op.is_kernel(old("Memcpy DtoH (Device -> Pageable)"))
    assert not op.is_kernel(old("speechperf::train_step"))
