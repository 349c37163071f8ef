"""Every data-parallel algorithm trains through ``speechperf train`` (2 gloo ranks under
torchrun, the tiny preset; asgd and easgd with their rpc parameter server): its communication in the iteration rows, its name in the label,
tta and report beside a single-process run; bsp with sync_every=1 equals sync; fsdp equals sync, and a
rank of it killed, the same command resumes it to the uninterrupted run's state (and one process
resumes its checkpoint too)."""
import json
import os
import subprocess

import pytest
import torch

from speechperf.config import load_preset
from speechperf.models import build_model
from speechperf.results import ResultsDB
from speechperf.results.checkpoint import load as load_checkpoint
from speechperf.results.events import read_events
from tests.train.test_elastic import assert_same_state
from tests.conftest import cli, shared_folder, torchrun, torchrun_args, torchrun_start

ARGS = ["--preset", "tiny", "max_epochs=1", "threads=1", "device=cpu", "final_splits=none", "checkpoint_every=1000"]
# where averaging models equals averaging gradients; 4 steps: CTC's summed loss has a large curvature,
# which amplifies the rounding that tells the two apart (measured on 9 steps: 0.5% of a weight)
SGD = ["train.optim.name=sgd", "lr=0.001", "grad_clip=0", "batch_size=12"]
RUNS = {  # name -> (processes, overrides)
    "single": (1, [*SGD, "algo.name=single"]),
    "sync": (2, SGD),
    "bsp1": (2, [*SGD, "algo.name=bsp", "algo.sync_every=1"]),
    "bmuf": (2, ["algo.name=bmuf", "algo.sync_every=3"]),
    "diloco": (2, ["algo.name=diloco", "algo.sync_every=3"]),
    "asgd": (2, ["algo.name=asgd", "algo.sync_every=3"]),
    "easgd": (2, ["algo.name=easgd", "algo.sync_every=3", "algo.round_robin=true"]),
    # sharded (FSDP2): the first epoch's steps are sync's; two epochs, a checkpoint every 2 steps: the
    # uninterrupted run the SIGKILL case below resumes to
    "fsdp": (2, [*SGD, "algo.name=fsdp", "max_epochs=2", "checkpoint_every=2"]),
    # any model: a Conformer (tests/train/test_every_model.py's tiny sizes) under diloco
    "conformer-diloco": (2, ["model.name=conformer", "model.d_model=16", "model.layers=1", "model.heads=2",
                             "model.conv_kernel=3", "model.subsampling_channels=4", "algo.name=diloco",
                             "algo.sync_every=3"]),
}


def _train(procs: int, *args, timeout=300) -> subprocess.CompletedProcess:
    """``speechperf ARGS`` in one process, or under torchrun in ``procs``, one thread each."""
    if procs == 1:
        return cli(*args, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return torchrun(*torchrun_args(*args, procs=procs), timeout=timeout)


@pytest.fixture(scope="module")
def runs(tiny_features, tmp_path_factory):
    """The runs of RUNS, trained once per test session: a case xdist moves to the other worker
    reads them there instead of training all of them again (tests only read them)."""
    def build(root):
        for name, (procs, extra) in RUNS.items():
            p = _train(procs, "train", "--data", tiny_features, "--out", root / name, *ARGS, *extra)
            assert p.returncode == 0, f"{name}: {p.stdout[-2000:]}{p.stderr[-4000:]}"

    return shared_folder(tmp_path_factory, "algos", build)


def _iterations(run):
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    with ResultsDB(run / "results.db", readonly=True) as db:
        return db.query("SELECT iteration, step_s, comm_s, comm_bytes FROM iterations WHERE run_id = ? "
                        "ORDER BY iteration", [run_id])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["bmuf", "diloco", "conformer-diloco"])  # bsp: every step, below
def test_local_sgd_trains_and_records_its_communication_per_step(runs, name):
    run = runs / name
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "success" and summary["iterations"] > 3 and summary["mfu_pct"] is not None
    name = name.split("-")[-1]
    assert json.loads((run / "config.json").read_text())["algo"]["name"] == name
    rows = _iterations(run)
    model = load_checkpoint(run)["model"]
    param_bytes = sum(v.numel() * v.element_size() for k, v in model.items() if v.is_floating_point())
    for r in rows:  # one epoch: the iteration is the batch of the epoch; a sync every 3rd
        if r["iteration"] % 3 == 0:
            assert r["comm_bytes"] == param_bytes and 0 < r["comm_s"] < r["step_s"], r
        else:
            assert r["comm_bytes"] == 0 and r["comm_s"] == 0, r
    state = load_checkpoint(run)["algo"]
    assert state["name"] == name and len(state["ranks"]) == 2
    # the epoch ended on a common model: both ranks' weights are equal (bmuf: the look-ahead)
    for k, v in state["ranks"][0]["model"].items():
        assert torch.equal(v, state["ranks"][1]["model"][k]), k


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["asgd", "easgd"])
def test_asynchronous_algorithms_train_through_their_parameter_server(runs, name):
    run = runs / name
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "success" and summary["last_cer"] is not None
    model = load_checkpoint(run)["model"]
    param_bytes = sum(v.numel() * 4 for k, v in model.items() if v.is_floating_point() and "running" not in k)
    for r in _iterations(run):  # every 3rd step a push and a pull of the parameters (no batch-norm statistics)
        assert r["comm_bytes"] == (2 * param_bytes if r["iteration"] % 3 == 0 else 0), r
    state = load_checkpoint(run)["algo"]
    assert state["name"] == name and state["version"] > 0 and len(state["ranks"]) == 2
    assert state["server"].numel() * 4 == param_bytes


@pytest.mark.timeout(600)
def test_sync_records_ddp_bytes_every_step(runs):
    rows = _iterations(runs / "sync")
    model = load_checkpoint(runs / "sync")["model"]
    grads = sum(v.numel() * 4 for k, v in model.items() if "running" not in k and v.is_floating_point())
    assert rows and all(r["comm_bytes"] == grads and r["comm_s"] > 0 for r in rows)
    assert all(r["comm_bytes"] == 0 for r in _iterations(runs / "single"))
    assert json.loads((runs / "single" / "config.json").read_text())["algo"]["name"] == "single"
    assert "algo" not in load_checkpoint(runs / "sync")  # DDP's ranks hold one model: the checkpoint is as before


def _update(run) -> torch.Tensor:
    """The trained parameters minus the initial ones (the tiny preset's model, seed 1), flat."""
    torch.manual_seed(1)
    init = build_model(load_preset("tiny").model).state_dict()
    model = load_checkpoint(run)["model"]
    return torch.cat([(model[k] - v).reshape(-1) for k, v in init.items() if v.is_floating_point()
                      and "running" not in k])  # batch-norm statistics: DDP keeps rank 0's, bsp averages them


@pytest.mark.timeout(600)
def test_bsp_every_step_equals_sync_within_float_tolerance(runs):
    model = load_checkpoint(runs / "bsp1")["model"]
    param_bytes = sum(v.numel() * v.element_size() for v in model.values() if v.is_floating_point())
    rows = _iterations(runs / "bsp1")  # the local-SGD family's periodic sync, at a period of one
    assert rows and all(r["comm_bytes"] == param_bytes and 0 < r["comm_s"] < r["step_s"] for r in rows), rows
    state = load_checkpoint(runs / "bsp1")["algo"]
    assert state["name"] == "bsp" and len(state["ranks"]) == 2
    sync, bsp, single = _update(runs / "sync"), _update(runs / "bsp1"), _update(runs / "single")
    assert load_checkpoint(runs / "sync")["progress"]["iteration"] == 4
    assert (sync - bsp).norm() < 1e-3 * sync.norm()  # measured: 2e-5 after 2 steps
    assert (sync - single).norm() > 0.05 * sync.norm()  # the test can fail: one process normalizes 12 utterances


@pytest.mark.timeout(600)
def test_algorithms_appear_in_tta_and_report_beside_a_single_process_run(runs, tmp_path):
    folders = [runs / n for n in ("single", "sync", "bmuf", "diloco")]
    p = _train(1, "tta", *folders, "--targets", "99", "--json")
    assert p.returncode == 0, p.stderr
    labels = [r["run"] for r in json.loads(p.stdout)["runs"]]
    assert len(labels) == 4 and labels[0].endswith("tiny fp32")
    assert [lb.split(" fp32 ")[-1] for lb in labels[1:]] == ["sync x2", "bmuf/3 x2", "diloco/3 x2"]
    p = _train(1, "report", *folders, "--out", tmp_path / "report")
    assert p.returncode == 0, p.stderr
    html = next((tmp_path / "report").glob("*.html")).read_text()
    assert "bmuf/3 x2" in html and "diloco/3 x2" in html


@pytest.mark.timeout(600)
def test_sigterm_to_torchrun_stops_a_bmuf_run_saved_recorded_and_the_same_command_continues(tiny_features,
                                                                                           tmp_path):
    import signal
    import time

    from speechperf.results.checkpoint import CheckpointError

    args = [*ARGS[:2], "max_epochs=2", "threads=1", "device=cpu", "final_splits=none", "checkpoint_every=2",
            "algo.name=bmuf", "algo.sync_every=3"]
    ref, run = tmp_path / "ref", tmp_path / "run"
    p = _train(2, "train", "--data", tiny_features, "--out", ref, *args)
    assert p.returncode == 0, p.stderr[-3000:]
    launcher = torchrun_start(*torchrun_args("train", "--data", tiny_features, "--out", run, *args))
    deadline = time.time() + 300
    while time.time() < deadline:  # stop it once a mid-run checkpoint exists
        try:
            if load_checkpoint(run)["progress"]["iteration"] >= 2:
                break
        except CheckpointError:
            pass
        assert launcher.poll() is None, "training finished before it could be stopped"
        time.sleep(0.02)
    launcher.send_signal(signal.SIGTERM)  # torchrun passes it on to every rank
    assert launcher.wait(timeout=200) != 0
    err = launcher.stderr.read()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed: interrupted (SIGTERM)", err[-3000:]
    saved = load_checkpoint(run)
    assert saved["progress"]["iteration"] == summary["iterations"] and len(saved["algo"]["ranks"]) == 2

    p = _train(2, "train", "--data", tiny_features, "--out", run, *args)  # the same command
    assert p.returncode == 0, p.stderr[-3000:]
    a, b = load_checkpoint(ref), load_checkpoint(run)
    assert a["progress"]["iteration"] == b["progress"]["iteration"] and b["progress"]["status"] == "success"
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    assert_same_state(a["algo"], b["algo"], "algo")  # every rank's model, optimizer, block momentum and RNG
    keys = [e["key"] for e in read_events(run / "events.log")]
    assert keys.count("resume") == 1 and keys.count("run_stop") == 1  # the stopped run's run_stop cut back
    # the stop saved a checkpoint where it fell, between two of the grid's or on one: its lines are left out
    stop = saved["progress"]["iteration"]

    def logged(folder):
        return [e["key"] for e in read_events(folder / "events.log") if e["key"] != "resume" and not (
            e["key"] in ("checkpoint", "checkpoint_written") and (e.get("metadata") or {}).get("iteration") == stop)]

    assert logged(run) == logged(ref)


def _losses(run) -> list[float]:
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    with ResultsDB(run / "results.db", readonly=True) as db:
        return [r["loss"] for r in db.query("SELECT loss FROM iterations WHERE run_id = ? ORDER BY iteration",
                                            [run_id])]


@pytest.mark.timeout(600)
def test_fsdp_equals_sync_and_records_its_gathers_and_reduce_scatters(runs):
    from speechperf.algorithms.fsdp import shard_units

    fsdp, sync = _losses(runs / "fsdp"), _losses(runs / "sync")
    assert len(fsdp) == 2 * len(sync) == 8
    for a, b in zip(fsdp, sync):  # the first epoch: the same batches, the same update
        assert abs(a - b) <= 1e-5 * abs(b), (fsdp, sync)
    torch.manual_seed(1)
    model = build_model(load_preset("tiny").model)
    units = shard_units(model)

    def padded(m):  # fp32 bytes, each parameter's first dimension padded to the 2 ranks
        return sum(4 * -(-p.shape[0] // 2) * 2 * (p.numel() // p.shape[0]) for p in m.parameters())
    unit_bytes, everything = sum(padded(u) for u in units), padded(model)
    # units gathered for their forward and again for their backward, the root once, every gradient
    # reduce-scattered once
    per_step = 2 * unit_bytes + (everything - unit_bytes) + everything
    assert all(r["comm_bytes"] == per_step and r["comm_s"] > 0 for r in _iterations(runs / "fsdp"))
    saved = load_checkpoint(runs / "fsdp")
    assert saved["model"].keys() == model.state_dict().keys() and "algo" not in saved  # the format of every run
    assert json.loads((runs / "fsdp" / "summary.json").read_text())["status"] == "success"


@pytest.mark.timeout(600)
def test_fsdp_rank_killed_then_the_same_command_equals_the_uninterrupted_run(runs, tiny_features, tmp_path):
    import shutil
    import signal
    import time

    import psutil

    from speechperf.results.checkpoint import CheckpointError

    run, one = tmp_path / "run", tmp_path / "one"
    args = ["train", "--data", tiny_features, "--out", run, *ARGS, *RUNS["fsdp"][1]]
    launcher = torchrun_start(*torchrun_args(*args))
    victim, deadline = None, time.time() + 300
    while victim is None and time.time() < deadline:  # rank 1, once a mid-run checkpoint exists
        try:
            if load_checkpoint(run)["progress"]["iteration"] >= 2:
                victim = launcher.workers().get(1)
        except CheckpointError:
            pass
        assert launcher.poll() is None, "training finished before a rank could be killed"
        time.sleep(0.02)
    psutil.Process(victim).send_signal(signal.SIGKILL)
    assert launcher.wait(timeout=200) != 0
    killed = load_checkpoint(run)["progress"]["iteration"]
    assert 2 <= killed < 8
    shutil.copytree(run, one)
    p = _train(2, *args)  # the same command
    assert p.returncode == 0, p.stderr[-3000:]
    a, b = load_checkpoint(runs / "fsdp"), load_checkpoint(run)
    assert a["progress"]["iteration"] == b["progress"]["iteration"] == 8 and b["progress"]["status"] == "success"
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    assert _losses(run) == _losses(runs / "fsdp")
    keys = [e["key"] for e in read_events(run / "events.log")]
    assert keys.count("resume") == 1 and keys.count("run_stop") == 1
    # the checkpoint of 2 ranks, resumed by one process: its shards are the whole tensors, from the same file
    p = _train(1, *[one if a == run else a for a in args])
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads((one / "summary.json").read_text())["status"] == "success"
    assert [e["key"] for e in read_events(one / "events.log")].count("resume") == 1
    assert _losses(one)[:killed] == _losses(run)[:killed]  # the rows before the checkpoint kept
