"""Elastic restarts: a restarted worker group repeats ``train --out RUN``, which continues the
run from its last checkpoint (``--resume auto``, the default); killing one of two workers
and repeating the command leaves a run equal to one never interrupted (gloo on CPU is
deterministic here), under DDP (sync), a local-SGD algorithm and an asynchronous one, whose
checkpoints hold every rank's own model, optimizer and RNG besides the global state (diloco:
the outer optimizer's; asgd: the parameter server's model).

The test repeats the torchrun command itself, as ``torchrun --max-restarts`` would: with
torch 2.13's CPU build, torchrun's own restart of a gloo group fails on this machine inside
``init_process_group`` (gloo connectFullMesh times out on the dead round's address, with
the static and the c10d rendezvous alike), before any speechperf code runs."""
import json
import signal
import time

import psutil
import pytest
import torch

from speechperf.results.checkpoint import CheckpointError, load as load_checkpoint
from speechperf.results.events import read_events
from tests.conftest import torchrun_args, torchrun_start

ARGS = ["--preset", "tiny", "max_epochs=3", "threads=1", "batch_size=4", "checkpoint_every=2", "sentence_every=3"]


def _torchrun(feats, out, extra=()):
    """torchrun in the background, its output in OUT.log."""
    return torchrun_start("--monitor-interval", "0.1",
                          *torchrun_args("train", "--data", feats, "--out", out, *ARGS, *extra), output=f"{out}.log")


def _log(out) -> str:
    return "\n".join(ln for ln in open(f"{out}.log").read().splitlines() if not ln.startswith(("iter", "  ref", "  hyp")))


def _rank(launcher, rank: int):
    """The launcher's worker of ``rank``, as the launcher noted it (tests/forked_cli.py; a
    worker forked from the test's server is not the launcher's child)."""
    pid = launcher.workers().get(rank)
    try:
        return None if pid is None else psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


# checkpoints every 2 steps, synchronizations every 3: the kill falls inside a block
# (asgd: its server serves the ranks in turn, which makes the run deterministic). One algorithm
# per kind of saved state: DDP's (sync); local SGD's ranks with an outer optimizer (diloco); a
# parameter server's (asgd). Local SGD's ranks with block momentum (bmuf) are stopped inside a
# block and continued to the uninterrupted run's state, every rank's included, by
# tests/train/test_algorithms_run.py's SIGTERM case. bsp saves local SGD's ranks alone and
# easgd asgd's state, through the same code (algorithms/local_sgd.py, asgd.py: neither overrides
# it); their sync rules are tested in tests/algorithms/test_hooks.py.
ALGOS = [pytest.param([], id="sync"),
         pytest.param(["algo.name=diloco", "algo.sync_every=3"], id="diloco"),
         pytest.param(["algo.name=asgd", "algo.sync_every=3", "algo.round_robin=true"], id="asgd")]


@pytest.mark.timeout(450)
@pytest.mark.parametrize("algo", ALGOS)
def test_a_killed_worker_then_the_same_command_equals_an_uninterrupted_run(algo, tiny_features, tmp_path):
    ref = _torchrun(tiny_features, tmp_path / "ref", algo)
    assert ref.wait(timeout=200) == 0, _log(tmp_path / "ref")

    p = _torchrun(tiny_features, tmp_path / "run", algo)
    victim, deadline = None, time.time() + 300
    while victim is None and time.time() < deadline:  # rank 1, once a mid-run checkpoint exists
        try:
            if load_checkpoint(tmp_path / "run")["progress"]["iteration"] >= 4:
                victim = _rank(p, 1)
        except CheckpointError:
            pass
        assert p.poll() is None, "training finished before a worker could be killed"
        time.sleep(0.02)
    assert victim is not None
    victim.send_signal(signal.SIGKILL)
    assert p.wait(timeout=200) != 0  # torchrun stops the group: the run is left unfinished
    left = tmp_path / "run" / "summary.json"  # rank 0, stopped by torchrun, records why (not finished)
    assert not left.exists() or json.loads(left.read_text())["status"].startswith("failed")
    again = _torchrun(tiny_features, tmp_path / "run", algo)  # the same command, as a restart repeats it
    assert again.wait(timeout=200) == 0, _log(tmp_path / "run")

    a, b = load_checkpoint(tmp_path / "ref"), load_checkpoint(tmp_path / "run")
    assert a["progress"]["iteration"] == b["progress"]["iteration"] and b["progress"]["status"] == "success"
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    assert ("algo" in a) == bool(algo)
    if algo:  # every rank's own state and the outer optimizer's, bit for bit
        assert_same_state(a["algo"], b["algo"], "algo")
    keys = [e["key"] for e in read_events(tmp_path / "run" / "events.log")]
    assert keys.count("resume") == 1 and keys.count("run_stop") == 1
    assert [k for k in keys if k != "resume"] == [e["key"] for e in read_events(tmp_path / "ref" / "events.log")]


def assert_same_state(x, y, where: str) -> None:
    """Nested checkpoint values equal, tensors bit for bit (torch's RNG state and the thread count
    included; numpy's and python's global generators start from the OS's entropy in every process
    and training draws from neither: they differ between any two runs)."""
    if isinstance(x, dict):
        assert x.keys() == y.keys(), where
        for k in x:
            if not (where.endswith(".rng") and k in ("numpy", "python")):
                assert_same_state(x[k], y[k], f"{where}.{k}")
    elif isinstance(x, (list, tuple)):
        assert len(x) == len(y), where
        for i, (u, v) in enumerate(zip(x, y)):
            assert_same_state(u, v, f"{where}[{i}]")
    elif torch.is_tensor(x):
        assert torch.equal(x, y), where
    else:
        assert x == y, where
