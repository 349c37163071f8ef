"""Resume after SIGKILL continues the same run; DDP with 2 gloo processes trains (on the CPU,
and sharing one GPU where there is one), rank 0 alone printing its summary; a launch that does
not fit the GPUs is refused."""
import json
import os
import signal
import time

import pytest
import torch

from speechperf.results import ResultsDB
from speechperf.results.checkpoint import CheckpointError, load as load_checkpoint
from speechperf.results.events import read_events
from tests.conftest import cli_start, torchrun, torchrun_args

ARGS = ["--preset", "tiny", "max_epochs=5", "threads=1", "checkpoint_every=4", "sentence_every=3"]
# On a GPU the resume is exact only with deterministic kernels (cuDNN, cuBLAS, CTC).
DEVICES = [pytest.param(["device=cpu"], id="cpu"),
           pytest.param(["device=cuda", "deterministic=true", "sync_every=5"], id="cuda", marks=pytest.mark.cuda)]


def _train(*args):
    return cli_start("train", *args)


def _rows(run, sql):
    info = json.loads((run / "run.json").read_text())
    with ResultsDB(run / "results.db", readonly=True) as db:
        return db.query(sql, [info["run_id"]])


@pytest.mark.parametrize("device", DEVICES)
def test_sigkill_then_resume_matches_uninterrupted_run(device, tiny_features, tmp_path):
    ref, run = tmp_path / "ref", tmp_path / "run"
    p = _train("--data", tiny_features, "--out", ref, *ARGS, *device)
    assert p.wait(timeout=300) == 0, p.stderr.read()

    p = _train("--data", tiny_features, "--out", run, *ARGS, *device)
    deadline = time.time() + 300
    while time.time() < deadline:  # kill once a mid-run checkpoint exists
        try:
            if load_checkpoint(run)["progress"]["iteration"] >= 8:
                break
        except CheckpointError:
            pass
        assert p.poll() is None, "training finished before it could be killed"
        time.sleep(0.02)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    killed_at = load_checkpoint(run)["progress"]
    time.sleep(1.5)  # down time must not be counted
    q = _train("--resume", run)
    assert q.wait(timeout=300) == 0, q.stderr.read()

    a, b = load_checkpoint(ref), load_checkpoint(run)
    assert a["progress"]["iteration"] == b["progress"]["iteration"]
    # Same seed, same data order, same RNG state restored: bit-identical on one thread;
    # the tolerance only absorbs float reordering we do not expect on CPU. On a GPU
    # deterministic kernels promise the bits.
    for k, v in a["model"].items():
        if "device=cuda" in device:
            assert torch.equal(v, b["model"][k]), k
        else:
            assert torch.allclose(v.float(), b["model"][k].float(), atol=1e-5), k
    ea = _rows(ref, "SELECT epoch, cer, wer FROM evals WHERE run_id = ? ORDER BY final, split, epoch")
    eb = _rows(run, "SELECT epoch, cer, wer FROM evals WHERE run_id = ? ORDER BY final, split, epoch")
    assert [(r["epoch"], round(r["cer"], 4)) for r in ea] == [(r["epoch"], round(r["cer"], 4)) for r in eb]

    its = _rows(run, "SELECT iteration, clock_s FROM iterations WHERE run_id = ? ORDER BY iteration")
    assert [r["iteration"] for r in its] == list(range(1, len(its) + 1))
    clocks = [r["clock_s"] for r in its]
    assert clocks == sorted(clocks)
    gap = clocks[killed_at["iteration"]] - clocks[killed_at["iteration"] - 1]
    assert gap < 1.5, f"the clock counted the down time ({gap:.2f} s)"

    keys = [e["key"] for e in read_events(run / "events.log")]
    ref_keys = [e["key"] for e in read_events(ref / "events.log")]
    assert keys.count("resume") == 1
    assert [k for k in keys if k != "resume"] == ref_keys  # no event lost or doubled


def _torchrun(nproc, *args, timeout=380):
    return torchrun(*torchrun_args("train", *args, procs=nproc), timeout=timeout)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("device", [pytest.param(["device=cpu"], id="cpu"),
                                    pytest.param(["device=cuda:0", "dist_backend=gloo"], id="one-gpu-gloo",
                                                 marks=pytest.mark.cuda)])
def test_ddp_two_gloo_processes(device, tiny_features, tmp_path):
    run = tmp_path / "ddp"
    p = _torchrun(2, "--data", tiny_features, "--out", run, "--preset", "tiny", "max_epochs=1", "threads=1",
                  "batch_size=4", "sync_every=3", *device, "--json")  # ranks agree on stopping at read points only
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads((run / "summary.json").read_text())
    rows = json.loads(p.stdout)  # only rank 0 prints the summary: a second rank's row would break the document
    assert len(rows) == 1 and rows[0] == summary
    single = _train("--data", tiny_features, "--out", tmp_path / "single", "--preset", "tiny", "max_epochs=1",
                    "threads=1", "batch_size=4", *device[:1])
    assert single.wait(timeout=300) == 0
    one = json.loads((tmp_path / "single" / "summary.json").read_text())
    # batch_size is the total over ranks: both runs see the epoch in the same number of steps
    assert abs(summary["iterations"] - one["iterations"]) <= 1
    events = read_events(run / "events.log")
    assert [e["value"] for e in events if e["key"] == "world_size"] == [2]
    assert summary["status"] == "success"


@pytest.mark.cuda
@pytest.mark.timeout(200)
def test_more_processes_than_gpus_under_nccl_is_refused_before_any_work(tiny_features, tmp_path):
    n = torch.cuda.device_count() + 1
    p = _torchrun(n, "--data", tiny_features, "--out", tmp_path / "many", "--preset", "tiny", "max_epochs=1",
                  timeout=180)
    assert p.returncode != 0
    assert f"{n} processes on this node but {n - 1} visible GPU" in p.stderr and "dist_backend=gloo" in p.stderr
    assert not (tmp_path / "many" / "run.json").exists()
