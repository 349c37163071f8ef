"""``bench scale --world N``: the rows sharded (FSDP2) over N torchrun ranks beside one device's, the
scaling efficiency between them, the memory estimate at N ranks against the measured peak."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from speechperf.bench import scale, scale_launch

TINY = ["model.d_model=32", "model.layers=2", "model.heads=2", "model.subsampling_channels=8"]


def _row(world: int, rate: float, status: str = "ok", batch_s: float = 40.0) -> dict:
    return {"workload": "fastconformer-l", "batch_s": batch_s, "world": world, "audio_s_per_s": rate,
            "status": status}


def test_the_efficiency_is_n_devices_rate_over_n_times_one_devices():
    ones = [_row(1, 10.0), _row(1, 10.0, batch_s=60.0, status="does not fit: ...")]
    got = scale_launch.efficiencies([_row(2, 15.0), _row(2, 12.0, batch_s=60.0)], ones)
    assert got[0]["scaling_efficiency"] == pytest.approx(0.75)
    assert got[1]["scaling_efficiency"] is None  # its one-device row did not run
    assert scale_launch.efficiencies([_row(2, 15.0, status="failed: x")], ones)[0]["scaling_efficiency"] is None


def test_one_device_is_measured_at_one_ranks_share_of_the_cpu(monkeypatch):
    seen = {}

    def child(req, threads, refuse_unfit=True):
        seen.setdefault("children", []).append((req.world, threads, refuse_unfit))
        return [_row(req.world, 10.0 if req.world == 1 else 18.0)]

    monkeypatch.setattr(scale_launch, "child", child)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    rows = scale_launch.measure(scale.Request(("fastconformer-l",), (40.0,), world=2), progress=False)
    # 4 cores / 2 ranks each, the one device too; its rows kept where none fits (the N ranks' may)
    assert seen["children"] == [(1, 2, False), (2, 2, True)]
    assert [r["world"] for r in rows] == [1, 2] and rows[1]["scaling_efficiency"] == pytest.approx(0.9)


def _saved(tmp_path, *rows, name: str = "one.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(list(rows)))
    return path


def test_a_saved_baseline_stands_for_the_one_device_rows(monkeypatch, tmp_path):
    worlds = []
    monkeypatch.setattr(scale_launch, "child", lambda req, threads, refuse_unfit=True: worlds.append(req.world) or [
        {**_row(2, 18.0), "precision": "fp32", "device": "cpu"},
        {**_row(2, 9.0, batch_s=60.0), "precision": "fp32", "device": "cpu"}])
    base = _saved(tmp_path, {**_row(1, 10.0), "precision": "fp32", "device": "cpu"},
                  {**_row(1, 5.0, batch_s=60.0), "precision": "bf16", "device": "cpu"},  # another precision
                  {**_row(2, 1.0), "precision": "fp32", "device": "cpu"})  # not a one-device row
    rows = scale_launch.measure(scale.Request(("fastconformer-l",), (40.0, 60.0), world=2), progress=False,
                                baseline=base)
    assert worlds == [2] and [r["world"] for r in rows] == [1, 2, 2]  # nothing measured at one device here
    assert rows[0]["source"] == str(base) and rows[0]["audio_s_per_s"] == 10.0  # the baseline row used, said so
    assert rows[1]["scaling_efficiency"] == pytest.approx(0.9) and rows[2]["scaling_efficiency"] is None
    assert f"one-device rows read from {base} (--baseline), not measured here" in scale.notes(rows)
    from speechperf.studies.cost import from_scale_file  # the output is whole for `speechperf cost`

    out = _saved(tmp_path, *[{**r, "steps": 3, "step_s": 1.0} for r in rows], name="out.json")
    assert from_scale_file(out, "fastconformer-l").efficiency == {2: pytest.approx(0.9)}
    assert ("fastconformer-l 60 s x2: no scaling efficiency: no one-device row of the same workload, batch, precision "
            "(fp32) and device measured") in scale.notes(rows)


def test_under_a_torchrun_of_several_nodes_rank_0_compares_with_the_baseline(monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setattr(scale_launch, "run_scale", lambda req, progress, refuse_unfit: [
        {**_row(16, 1440.0), "precision": "bf16", "device": "cuda:0"}])
    base = _saved(tmp_path, {**_row(1, 100.0), "precision": "bf16", "device": "cuda:0"})
    req = scale.Request(("fastconformer-l",), (40.0,), world=16)
    one, row = scale_launch.measure(req, progress=False, baseline=base)
    assert row["scaling_efficiency"] == pytest.approx(0.9) and one["world"] == 1 and one["source"] == str(base)
    monkeypatch.setenv("RANK", "3")  # the other ranks print nothing
    assert scale_launch.measure(req, progress=False, baseline=base) == []


def test_a_baseline_at_one_device_or_unreadable_is_refused(tmp_path, capsys):
    from speechperf.cli import main

    base = _saved(tmp_path, _row(1, 10.0))
    assert main(["bench", "scale", "--baseline", str(base)]) == 2
    assert f"--baseline {base}: the one-device rows N devices are compared with; this command measures one" in \
        capsys.readouterr().err
    bad = _saved(tmp_path, {**_row(1, 10.0), "audio_s_per_s": -1})
    with pytest.raises(scale_launch.SpeechperfError, match=r"one.json: row 0 \(fastconformer-l\): audio_s_per_s=-1 "
                                                           "is not a positive number"):
        scale_launch.measure(scale.Request(world=2), baseline=bad)


def test_bench_scale_world_2_shards_over_two_torchrun_ranks_on_the_cpu(tmp_path):
    cmd = [sys.executable, "-m", "speechperf", "bench", "scale", "--world", "2", "--workloads", "fastconformer-l",
           "--batch-seconds", "40", "--steps", "2", "--warmup", "1", "--json", *TINY]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "SPEECHPERF_CACHE": str(tmp_path)})
    assert p.returncode == 0, p.stderr[-3000:]
    one, two = json.loads(p.stdout)
    assert (one["world"], two["world"]) == (1, 2) and one["status"] == two["status"] == "ok"
    assert one["params_m"] == two["params_m"] and two["audio_s_per_s"] > 0
    assert two["scaling_efficiency"] == pytest.approx(two["audio_s_per_s"] / (2 * one["audio_s_per_s"]))
    assert two["comm_gb"] > 0 and two["comm_s"] > 0 and one["comm_gb"] is None  # FSDP2's gathers, reductions
    # the estimate for fsdp at 2 ranks against the peak the rank that used most measured (a tiny model:
    # tests/hardware/test_memory.py's 15%, plus what no rule counts at width 32)
    assert 0.75 < two["estimate_ratio"] < 1.25 and "the rank that used most" in two["memory_method"]
    assert two["utterances"] == pytest.approx(3.0, abs=1.0)


def test_a_memory_limit_on_a_cpu_is_the_hosts_shared_by_its_ranks(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    limit = scale._free_bytes(scale.Request(memory_limit_gb=21.0), torch.device("cpu"))
    assert limit == int(21.0 * scale.memory.GB) // 2


def test_a_childs_rows_are_read_even_when_none_ran_and_its_failure_is_named(monkeypatch):
    def finished(code, out, err=""):
        return lambda cmd, **kw: subprocess.CompletedProcess(cmd, code, out, err)

    unfit = [{**_row(1, None), "status": "does not fit: fastconformer-l at 40 s: the run needs 30.0 GB per device"}]
    monkeypatch.setattr(scale_launch.subprocess, "run", finished(1, "a warning\n" + json.dumps(unfit)))
    req = scale.Request(("fastconformer-l",), (40.0,))
    assert scale_launch.child(req, 1, refuse_unfit=False) == unfit  # exit 1: no row ran, each says why
    monkeypatch.setattr(scale_launch.subprocess, "run", finished(2, "", "speechperf: error: bad override x"))
    with pytest.raises(scale_launch.SpeechperfError, match=r"at 1 device\(s\): its process failed \(exit 2\)\n"
                                                          r"speechperf: error: bad override x"):
        scale_launch.child(req, 1)
    monkeypatch.setattr(scale_launch.subprocess, "run", finished(-9, "", "some log line"))
    with pytest.raises(scale_launch.SpeechperfError, match=r"\(exit -9\)\nsome log line\non a CPU host glibc's heap "
                                                          r"keeps freed blocks .* MALLOC_MMAP_THRESHOLD_=1048576 "):
        scale_launch.child(req, 1)


def test_a_rank_killed_by_the_kernel_is_named():
    err = ("[rank1]: RuntimeError: boom\nnoise\nE1207 09:47:16 28163 torch/distributed/elastic/multiprocessing/api.py:1002] "
           "failed (exitcode: -9) local_rank: 1 (pid: 28168) of binary: /venv/bin/python")
    assert scale_launch._said(err) == ["[rank1]: RuntimeError: boom", "a rank failed (exitcode: -9) local_rank: 1 "
                                       "(pid: 28168) of binary: /venv/bin/python (SIGKILL: out of memory?)"]


def test_what_the_sharded_loop_refuses_is_refused_before_a_rank_starts():
    from speechperf.config import ConfigError

    with pytest.raises(ConfigError, match="algo.name=fsdp does not train with train.system.precision=fp16"):
        scale._config(scale.Request(world=2, precision="fp16"), "fastconformer-l", 30.0, torch.device("cpu"))
