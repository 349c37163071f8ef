"""Devices and process groups for data-parallel runs of the training loop (every algorithm:
speechperf/algorithms).

One place decides, from the torchrun environment and the configuration, which device a
process trains on and which backend its process group uses, and checks the combination
before any work:

- ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` (set by torchrun) give
  the process's place; without them a process is rank 0 of 1.
- ``device=auto`` is ``cuda:LOCAL_RANK`` when CUDA is available, else the CPU; ``cuda``
  alone means the local rank's GPU; ``cuda:N`` is taken as written (every process on GPU N:
  sharing one GPU works through gloo only).
- ``dist_backend=auto`` is ``cpu:gloo,cuda:nccl`` on a GPU (NCCL for the gradients, gloo for
  the CPU control tensors) and ``gloo`` on the CPU. Under plain ``nccl`` the control
  tensors live on the GPU, since NCCL serves no CPU tensor.
- NCCL cannot put two ranks of a node on one GPU: more processes per node than visible
  GPUs is refused naming both numbers and the ways out. Under gloo processes share GPUs
  (``auto``: local rank modulo the GPU count).

The collective helpers (:meth:`Group.agree`, :meth:`Group.broadcast`,
:meth:`Group.broadcast_float`, :meth:`Group.gather_int`) work under every backend and are
identities for a single process.
"""
from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from speechperf.config import ConfigError
from speechperf.config.training import DIST_BACKENDS as BACKENDS

MIXED = "cpu:gloo,cuda:nccl"
# cuBLAS reproducibility (CUDA docs, "Results reproducibility"): a fixed workspace per handle.
CUBLAS_WORKSPACE = ":4096:8"


class DistributedSetupError(ConfigError):
    """The processes, the devices and the backend do not fit together."""


@dataclass(frozen=True)
class DistEnv:
    """This process's place in a torchrun launch (rank 0 of 1 without torchrun)."""

    rank: int = 0  # global rank
    world: int = 1  # processes in all
    local_rank: int = 0  # rank on this node
    local_world: int = 1  # processes on this node

    @classmethod
    def from_env(cls, env=None) -> "DistEnv":
        env = os.environ if env is None else env
        world = int(env.get("WORLD_SIZE", 1))
        # LOCAL_WORLD_SIZE is torchrun's; without it (a hand-made launch) assume one node
        return cls(rank=int(env.get("RANK", 0)), world=world, local_rank=int(env.get("LOCAL_RANK", 0)),
                   local_world=int(env.get("LOCAL_WORLD_SIZE", world)))


def visible_gpus() -> int:
    """CUDA devices this process sees (0 without CUDA); monkeypatched in tests."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_backend(name: str, device: torch.device) -> str:
    """The process-group backend for ``device``: ``auto`` is gloo on the CPU and gloo+NCCL on a GPU."""
    if name not in BACKENDS:
        raise DistributedSetupError(f"train.system.dist_backend={name!r} must be one of {', '.join(BACKENDS)}")
    if name == "auto":
        return MIXED if device.type == "cuda" else "gloo"
    if name == "nccl" and device.type != "cuda":
        raise DistributedSetupError(f"train.system.dist_backend=nccl needs CUDA devices but this process trains on "
                                    f"{device}; use train.system.dist_backend=gloo (or auto)")
    return name


def pick_device(name: str, env: DistEnv, backend: str = "auto", gpus: int | None = None) -> torch.device:
    """The device of this process, checked against the GPUs it sees and the backend.

    Raises before any work when processes per node exceed the GPUs under NCCL, or when a
    named GPU does not exist."""
    gpus = visible_gpus() if gpus is None else gpus
    if name == "cpu":
        return torch.device("cpu")
    if name == "auto" and gpus == 0:
        return torch.device("cpu")
    if not (name in ("auto", "cuda") or (name.startswith("cuda:") and name[5:].isdigit())):
        raise DistributedSetupError(f"train.system.device={name!r} must be auto, cpu, cuda or cuda:N")
    if gpus == 0:
        raise DistributedSetupError(f"train.system.device={name!r} but no CUDA device is visible; use device=cpu")
    nccl = backend != "gloo"  # auto on a GPU is the mixed backend: NCCL carries the gradients
    if name.startswith("cuda:"):
        index = int(name[5:])
        if index >= gpus:
            raise DistributedSetupError(f"train.system.device={name} but only {gpus} GPU(s) are visible "
                                        f"(cuda:0..cuda:{gpus - 1})")
        if env.local_world > 1 and nccl:
            raise DistributedSetupError(
                f"train.system.device={name} puts all {env.local_world} processes of this node on one GPU, which NCCL "
                f"refuses; use dist_backend=gloo to share it, device=auto (one GPU per process), or device=cpu")
        return torch.device("cuda", index)
    if env.local_world > gpus:
        if nccl:
            raise DistributedSetupError(
                f"{env.local_world} processes on this node but {gpus} visible GPU(s): NCCL needs one GPU per process. "
                f"Start at most {gpus} process(es) per node (torchrun --nproc-per-node {gpus}), set "
                f"dist_backend=gloo to let processes share GPUs, or train on the CPU with device=cpu")
        return torch.device("cuda", env.local_rank % gpus)  # gloo: processes share GPUs round robin
    return torch.device("cuda", env.local_rank)


def configure_determinism(on: bool) -> None:
    """Deterministic kernels on request; the cuBLAS workspace is fixed before CUDA starts.

    Without it cuDNN picks the fastest (autotuned, possibly atomics-based) algorithms and
    a resumed GPU run agrees with the uninterrupted one only to rounding."""
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(on)
    torch.backends.cudnn.deterministic = on
    torch.backends.cudnn.benchmark = False


class Group:
    """The process group of a run (None for one process) and its collective helpers.

    Control tensors (flags, floats, counts) are CPU tensors whenever the backend serves the
    CPU (gloo or the mixed backend) and live on the process's GPU under plain NCCL."""

    def __init__(self, env: DistEnv, device: torch.device, backend: str):
        self.env, self.device, self.backend = env, device, backend
        self.control = device if backend == "nccl" else torch.device("cpu")

    @property
    def world(self) -> int:
        return self.env.world

    def agree(self, flag: bool) -> bool:
        """All ranks decide together: any rank's True is everyone's."""
        if self.world == 1:
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=self.control)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def broadcast(self, value):
        """Rank 0's picklable ``value`` on every rank."""
        if self.world == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0, device=self.control)
        return box[0]

    def broadcast_float(self, value: float) -> float:
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.control)
        dist.broadcast(t, 0)
        return float(t.item())

    def gather_int(self, value: int) -> list[int]:
        """Every rank's ``value``, in rank order, on every rank."""
        if self.world == 1:
            return [value]
        parts = [torch.zeros(1, dtype=torch.int64, device=self.control) for _ in range(self.world)]
        dist.all_gather(parts, torch.tensor([value], dtype=torch.int64, device=self.control))
        return [int(t.item()) for t in parts]

    def barrier(self) -> None:
        if self.world > 1:
            if self.control.type == "cuda":
                dist.barrier(device_ids=[self.control.index])
            else:
                dist.barrier()

    def close(self) -> None:
        """The group's end, after the run's models: a DDP model freed after it (one in a reference
        cycle, freed whenever the collector runs) frees the group from its C++ reducer, whose
        destructor joins gloo's thread while holding the GIL that thread may wait for: a hang
        (caught with its stacks in the tests' gloo workers, tests/forked_cli.py ``in_group``)."""
        if self.world > 1 and dist.is_initialized():
            gc.collect()  # the models no frame holds any more go now, while the group is registered
            dist.destroy_process_group()


def setup(device: str = "auto", backend: str = "auto", env: DistEnv | None = None) -> Group:
    """Check the launch, pick and select the device, and join the process group (several
    processes only). Every check runs before the group is joined, so a misfit launch fails
    at once on every rank instead of hanging in the first collective."""
    env = DistEnv.from_env() if env is None else env
    dev = pick_device(device, env, backend)
    resolved = resolve_backend(backend, dev)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)  # NCCL and broadcast_object_list use the current device
    if env.world > 1:
        dist.init_process_group(backend=resolved, rank=env.rank, world_size=env.world)
    return Group(env, dev, resolved)
