"""``fsdp``: sharded data parallelism, FSDP2 (``torch.distributed.fsdp.fully_shard``).

Every rank holds ``1/world`` of each parameter, of its gradient and of the optimizer's state;
a sharded unit's parameters are all-gathered whole just before its forward (and again before
its backward when ``algo.reshard_after_forward``), and its gradients reduce-scattered back into
shards after its backward. The update is DDP's (the mean gradient over the ranks' batches),
so a run equals ``sync`` within float rounding (tests/algorithms/test_fsdp.py).

The units (:func:`shard_units`): the items of every ``nn.ModuleList`` holding at least
``algo.shard_share`` of the parameters (the repeated blocks: the Conformer's ``blocks``, DS2's
LSTMs), and every other module holding that share none of whose own modules does (DS2's
convolution); the root holds the rest. ``algo.shard_modules`` names them instead. With
``algo.checkpoint_blocks`` each unit is wrapped in torch's ``checkpoint_wrapper`` first (its
activations recomputed in the backward).

Mixed precision (:func:`policy`): on a CUDA device with ``train.system.precision=bf16`` the parameters
are all-gathered and computed in bf16 and the gradients reduced in fp32 (FSDP2's
``MixedPrecisionPolicy``), the shards and the optimizer staying fp32. On the CPU the policy is
fp32 (autocast computes bf16 where asked, as for every other algorithm): gloo reduces bf16 and
fp16 too (reduce_scatter, all_gather and all_reduce, measured with torch 2.13), but a CPU run
stays numerically the other algorithms' run.

A sharded model is re-parameterized (its parameters become DTensors): ``shards`` tells the
trainer to build the optimizer after :meth:`FSDP.wrap` and to save and restore the model and
optimizer through :meth:`FSDP.whole_state` / :meth:`FSDP.load_whole_state`, the full state dicts
(gathered to rank 0; on resume every rank takes its shards from them). A checkpoint is thus the
one format every run writes (results/checkpoint.py: data only, read without unpickling code),
its model the unsharded model's keys, and resumes at any world size. Rank 0 evaluates a plain
copy of the model, loaded from the gathered state before each evaluation; the copy is on its
device only during an evaluation (host memory otherwise: ``after_eval``).
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from speechperf.algorithms import register_algorithm
from speechperf.algorithms.base import AlgoConfig, Algorithm, CommMeter, unwrapped
from speechperf.errors import ConfigError


@dataclass(frozen=True)
class FSDPConfig(AlgoConfig):
    """How the model is sharded."""

    name: str = "fsdp"  # the registry key
    # the sharded units: auto (shard_units' rule), or module names, comma-separated (a ModuleList's: its items)
    shard_modules: str = "auto"
    shard_share: float = 0.1  # auto: a module outside the repeated blocks is a unit from this share of the parameters
    # free each unit's gathered parameters after its forward, gathered again for its backward (less memory,
    # 1.5x the all-gathers)
    reshard_after_forward: bool = True
    # recompute each unit's activations in its backward (torch's checkpoint_wrapper) instead of keeping them
    checkpoint_blocks: bool = False

    def problems(self) -> list[str]:
        out = []
        if not 0 < self.shard_share <= 1:
            out.append(f"algo.shard_share={self.shard_share} must be in (0, 1]")
        if not self.shard_modules.strip() or any(not n.strip() for n in self.shard_modules.split(",")):
            out.append(f"algo.shard_modules={self.shard_modules!r} must be auto or module names, comma-separated")
        return out


def _size(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def shard_units(model: nn.Module, share: float = 0.1) -> list[nn.Module]:
    """The modules sharded as units before the root, in the model's order: each item of an
    ``nn.ModuleList`` or ``nn.ModuleDict`` holding at least ``share`` of the parameters (the
    repeated blocks, whose forward the model calls), and each other module of at least ``share``
    none of whose own modules is a unit; a unit's modules are its own, the root keeps what no
    unit holds (DS2's small batch norms, the heads)."""
    threshold = share * _size(model)

    def visit(module: nn.Module, repeated: bool) -> list[nn.Module]:
        found = []
        for child in module.children():
            if not _size(child):
                continue
            if isinstance(child, (nn.ModuleList, nn.ModuleDict)):  # its items: repeated blocks, if they weigh
                found += visit(child, _size(child) >= threshold)
            elif repeated:
                found.append(child)
            else:
                found += visit(child, False) or ([child] if _size(child) >= threshold else [])
        return found

    return visit(model, False)


def named_units(model: nn.Module, names: str) -> list[nn.Module]:
    """The modules ``algo.shard_modules`` names (a ModuleList or ModuleDict: its items); a name
    the model lacks is a ConfigError naming the model's top-level modules."""
    modules = dict(model.named_modules())
    out = []
    for name in (n.strip() for n in names.split(",")):
        if name not in modules or not name:
            raise ConfigError(f"algo.shard_modules: the model has no module {name!r}; its modules: "
                              f"{', '.join(n for n, _ in model.named_children())}")
        m = modules[name]
        out += list(m.children()) if isinstance(m, (nn.ModuleList, nn.ModuleDict)) else [m]
    return out


def policy(precision: str, device: torch.device):
    """FSDP2's mixed precision: bf16 parameters and fp32 gradient reduction for bf16 on a CUDA
    device; otherwise fp32 throughout (None: the parameters' own dtype)."""
    # heavy: torch.distributed's parts load only when a run uses them
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision in ("bf16", "fp8") and device.type == "cuda":  # fp8: bf16 outside its float8 products
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


@register_algorithm("fsdp", FSDPConfig)
class FSDP(Algorithm):
    """Fully sharded data parallelism (FSDP2); one process shards nothing but runs the same code
    (its activation checkpointing and mixed precision), and resumes another world's checkpoint."""

    shards = True
    evaluates = True  # rank 0 keeps a host copy to evaluate (False: a benchmark that only steps, bench scale)

    @classmethod
    def check_launch(cls, cfg, world, train=None):
        if train is None:
            return
        system = train.system
        refused = [(system.compile, "train.system.compile=true", "torch.compile does not trace FSDP2's hooks here"),
                   (system.cuda_graphs, "train.system.cuda_graphs=true", "a graph cannot capture the collectives"),
                   (system.precision == "fp16", "train.system.precision=fp16",
                    "its loss scaler sees this rank's shards only; use train.system.precision=bf16")]
        for on, setting, why in refused:
            if on:
                raise ConfigError(f"algo.name=fsdp does not train with {setting}: {why}")

    def wrap(self, local):
        # heavy: torch.distributed's parts load only when a run uses them
        from torch.distributed.fsdp import fully_shard

        self.core = unwrapped(local)
        self._own_group = not dist.is_initialized()
        if self._own_group:  # one process: a group of one, so that the same code shards
            backend = "cpu:gloo,cuda:nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        # what rank 0 evaluates: in host memory between evaluations, so that rank 0's device holds its shards
        # as the others do (a whole fp32 copy there, 3.9 GB at Canary's sizes, is what sharding saves)
        self.replica = host_copy(self.core) if self.rank == 0 and self.evaluates else None
        mesh = _mesh(self.device, self.world)
        kw = {"mesh": mesh, "mp_policy": policy(self.train.system.precision if self.train else "fp32", self.device)}
        units = (shard_units(self.core, self.cfg.shard_share) if self.cfg.shard_modules.strip() == "auto"
                 else named_units(self.core, self.cfg.shard_modules))
        for unit in units:
            if self.cfg.checkpoint_blocks:
                unit = _checkpointed(self.core, unit)
            fully_shard(unit, reshard_after_forward=self.cfg.reshard_after_forward, **kw)
        fully_shard(self.core, **kw)  # the root: what no unit holds (FSDP2 keeps it gathered for the backward)
        self.units = len(units)
        for module in self.core.modules():
            if hasattr(module, "set_custom_all_gather"):
                module.set_custom_all_gather(CountedAllGather(self.comm))
                module.set_custom_reduce_scatter(CountedReduceScatter(self.comm))
        return local

    def before_eval(self, batches_done):
        """Every rank: the parameters gathered whole; rank 0 evaluates its plain copy of them."""
        if self.rank == 0 and self.replica is None:
            raise RuntimeError("fsdp: rank 0 was wrapped with evaluates=False and has no copy to evaluate")
        model, _ = self.whole_state(None)
        if self.rank == 0:
            self.replica.load_state_dict(model)
            return self.replica.to(self.device)
        return self.core

    def after_eval(self):
        if self.replica is not None:
            self.replica.to("cpu")  # its device memory back to the training (torch's caching allocator)

    def whole_state(self, optimizer) -> tuple[dict, dict]:
        """(model, optimizer) state dicts of the unsharded model, on rank 0's CPU (a collective;
        the other ranks get empty dicts): the keys a model without FSDP has (checkpoint_wrapper's
        prefix left out); the optimizer's state keyed by those names."""
        # heavy: torch.distributed's parts load only when a run uses them
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model = get_model_state_dict(self.core, options=options)
        return model, ({} if optimizer is None else get_optimizer_state_dict(self.core, optimizer, options=options))

    def load_whole_state(self, model: dict, optimizer_state: dict, optimizer) -> None:
        """Every rank: its shards of :meth:`whole_state`'s dicts (which every rank read from the
        checkpoint), whatever world wrote them."""
        # heavy: torch.distributed's parts load only when a run uses them
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)

        options = StateDictOptions(full_state_dict=True)
        # torch puts this rank's shards into the dicts it is given: copies, the caller's stay whole
        model, optimizer_state = _copied(model), _copied(optimizer_state)
        set_model_state_dict(self.core, model, options=options)
        states = optimizer_state.get("state", {}).values()
        if not any(torch.is_tensor(v) and v.dim() for state in states for v in state.values()):
            # a stateless optimizer (plain SGD): torch's loader finds the device from a state tensor and
            # refuses; its groups' hyper-parameters are all there is (the parameters: the model's, in order)
            for group, saved in zip(optimizer.param_groups, optimizer_state["param_groups"], strict=True):
                group.update({k: v for k, v in saved.items() if k != "params"})
            return
        set_optimizer_state_dict(self.core, optimizer, optimizer_state, options=options)

    def close(self, graceful=True):
        if getattr(self, "_own_group", False) and dist.is_initialized():
            dist.destroy_process_group()
            self._own_group = False


def _copied(value):
    """``value``'s dicts and lists copied, its tensors shared."""
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copied(v) for v in value)
    return value


def host_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose parameters and buffers are in host memory, each tensor copied
    from the device straight to the host: ``deepcopy(module).to("cpu")`` would first make a whole
    second copy on the device (rank 0's GPU, the model's size, at the start of a sharded run).
    Shared tensors stay shared (deepcopy's memo)."""
    memo: dict[int, torch.Tensor] = {}
    for t in module.parameters():
        memo.setdefault(id(t), nn.Parameter(t.detach().to("cpu", copy=True), requires_grad=t.requires_grad))
    for t in module.buffers():
        memo.setdefault(id(t), t.detach().to("cpu", copy=True))
    return copy.deepcopy(module, memo)


def _mesh(device: torch.device, world: int):
    # heavy: torch.distributed's parts load only when a run uses them
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (world,))


def _checkpointed(root: nn.Module, unit: nn.Module) -> nn.Module:
    """``unit`` replaced in its parent by torch's ``checkpoint_wrapper`` of it (activations recomputed
    in the backward, the RNG replayed: the same numbers); returns the wrapper."""
    # heavy: torch.distributed's parts load only when a run uses them
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for parent in root.modules():
        for name, child in parent.named_children():
            if child is unit:
                wrapped = checkpoint_wrapper(unit)
                setattr(parent, name, wrapped)  # a ModuleList's item too (its name is its index)
                return wrapped
    raise ValueError("the unit is not a module of the model")


def _counted(work, meter: CommMeter, t0: float, nbytes: int):
    """Count a collective as it is issued (its bytes: exact, in the step that issued it) and its
    seconds once it completes (from gloo's or the device's completion)."""
    meter.add(0.0, nbytes)
    if work is None:
        meter.add(time.perf_counter() - t0, 0)
        return None
    work.get_future().then(lambda _: meter.add(time.perf_counter() - t0, 0))
    return work


class CountedAllGather:
    """FSDP2's default all-gather (``dist.all_gather_single``), counted: its output's bytes, the
    unit's padded parameters whole in the all-gather dtype (a collective counted once at its size,
    as sync counts DDP's all-reduce buckets)."""

    def __init__(self, meter: CommMeter):
        self.meter = meter

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        t0 = time.perf_counter()
        work = dist.all_gather_single(output_tensor, input_tensor, group=group, async_op=async_op)
        return _counted(work, self.meter, t0, output_tensor.numel() * output_tensor.element_size())


class CountedReduceScatter:
    """FSDP2's default reduce-scatter (``dist.reduce_scatter_single``), counted: its input's
    bytes, the unit's padded gradients whole in the reduction dtype."""

    def __init__(self, meter: CommMeter):
        self.meter = meter

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        t0 = time.perf_counter()
        work = dist.reduce_scatter_single(output=output_tensor, input=input_tensor, group=group, op=op,
                                          async_op=async_op)
        return _counted(work, self.meter, t0, input_tensor.numel() * input_tensor.element_size())
