"""Device and backend decisions for torchrun launches, on fake environments and GPU counts."""
import pytest
import torch

from speechperf.config import ConfigError, load_preset
from speechperf.train import distributed as d
from speechperf.train.distributed import DistEnv, DistributedSetupError, pick_device, resolve_backend


def test_env_from_torchrun_variables():
    env = DistEnv.from_env({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"})
    assert (env.rank, env.world, env.local_rank, env.local_world) == (5, 8, 1, 4)
    assert DistEnv.from_env({}) == DistEnv(0, 1, 0, 1)
    assert DistEnv.from_env({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}).local_world == 2  # one node


@pytest.mark.parametrize("name,env,gpus,want", [
    ("auto", DistEnv(), 0, "cpu"),
    ("cpu", DistEnv(3, 4, 3, 4), 4, "cpu"),
    ("auto", DistEnv(), 1, "cuda:0"),
    ("auto", DistEnv(5, 8, 1, 4), 4, "cuda:1"),  # second node, local rank 1
    ("cuda", DistEnv(3, 4, 3, 4), 4, "cuda:3"),  # bare cuda: the local rank's GPU
    ("cuda:1", DistEnv(), 2, "cuda:1"),
])
def test_device_per_local_rank(name, env, gpus, want):
    assert pick_device(name, env, "auto", gpus=gpus) == torch.device(want)


def test_more_processes_than_gpus_under_nccl_names_both_numbers_and_the_ways_out():
    env = DistEnv(rank=1, world=2, local_rank=1, local_world=2)
    for backend in ("auto", "nccl", "cpu:gloo,cuda:nccl"):
        with pytest.raises(DistributedSetupError) as e:
            pick_device("auto", env, backend, gpus=1)
        msg = str(e.value)
        assert "2 processes on this node but 1 visible GPU" in msg
        assert "dist_backend=gloo" in msg and "device=cpu" in msg and "--nproc-per-node 1" in msg
    with pytest.raises(DistributedSetupError, match="one GPU, which NCCL refuses"):
        pick_device("cuda:0", env, "auto", gpus=1)


def test_gloo_shares_gpus_and_cpu_needs_no_gpu():
    env = DistEnv(rank=1, world=2, local_rank=1, local_world=2)
    assert pick_device("auto", env, "gloo", gpus=1) == torch.device("cuda:0")
    assert pick_device("cuda:0", env, "gloo", gpus=1) == torch.device("cuda:0")
    assert pick_device("auto", DistEnv(2, 3, 2, 3), "gloo", gpus=2) == torch.device("cuda:0")
    assert pick_device("cpu", env, "nccl", gpus=0) == torch.device("cpu")


def test_missing_gpus_and_bad_names():
    with pytest.raises(DistributedSetupError, match="no CUDA device is visible; use device=cpu"):
        pick_device("cuda", DistEnv(), "auto", gpus=0)
    with pytest.raises(DistributedSetupError, match=r"cuda:2 but only 2 GPU\(s\)"):
        pick_device("cuda:2", DistEnv(), "auto", gpus=2)
    with pytest.raises(DistributedSetupError, match="must be auto, cpu, cuda or cuda:N"):
        pick_device("gpu0", DistEnv(), "auto", gpus=1)


def test_backend_resolution():
    assert resolve_backend("auto", torch.device("cpu")) == "gloo"
    assert resolve_backend("auto", torch.device("cuda", 0)) == "cpu:gloo,cuda:nccl"
    assert resolve_backend("gloo", torch.device("cuda", 0)) == "gloo"
    with pytest.raises(DistributedSetupError, match="dist_backend=nccl needs CUDA"):
        resolve_backend("nccl", torch.device("cpu"))
    with pytest.raises(ConfigError, match="dist_backend='mpi'"):
        load_preset("tiny", ["dist_backend=mpi"])
    assert load_preset("tiny", ["dist_backend=cpu:gloo,cuda:nccl"]).train.system.dist_backend == "cpu:gloo,cuda:nccl"


def test_setup_checks_before_joining_a_group(monkeypatch):
    """A misfit launch fails on every rank before init_process_group (which would hang)."""
    monkeypatch.setattr(d, "visible_gpus", lambda: 1)
    monkeypatch.setattr(d.dist, "init_process_group", lambda *a, **k: pytest.fail("joined the group"))
    with pytest.raises(DistributedSetupError, match="2 processes on this node but 1 visible GPU"):
        d.setup("auto", "auto", DistEnv(rank=0, world=2, local_rank=0, local_world=2))
    group = d.setup("cpu", "auto", DistEnv())
    assert (group.device, group.backend, group.control) == (torch.device("cpu"), "gloo", torch.device("cpu"))
    assert group.agree(True) and group.broadcast("x") == "x" and group.gather_int(3) == [3]


def test_control_tensors_follow_the_backend():
    assert d.Group(DistEnv(), torch.device("cuda", 1), "nccl").control == torch.device("cuda", 1)
    assert d.Group(DistEnv(), torch.device("cuda", 1), "cpu:gloo,cuda:nccl").control == torch.device("cpu")


def test_determinism_switch(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        d.configure_determinism(True)
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        assert not torch.backends.cudnn.benchmark
        import os

        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        d.configure_determinism(False)
    assert not torch.are_deterministic_algorithms_enabled()
