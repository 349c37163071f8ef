"""``sync``: synchronous SGD, DDP (one process: the model itself).

Its gradients go through torch's own ``allreduce_hook`` (DDP's default all-reduce, as a
comm hook) wrapped to count bytes and seconds.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from speechperf.algorithms import register_algorithm
from speechperf.algorithms.base import AlgoConfig, Algorithm, CommMeter, unwrapped


@dataclass(frozen=True)
class SyncConfig(AlgoConfig):
    """DDP: gradients averaged every step; nothing to configure."""

    name: str = "sync"  # the registry key


@register_algorithm("sync", SyncConfig)
class Sync(Algorithm):
    """DDP: gradients averaged every step."""

    def wrap(self, local):
        self.core = unwrapped(local)
        if self.world == 1:
            return local
        ids = [self.device.index] if self.device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(local, device_ids=ids)
        model.register_comm_hook(self.comm, counted_allreduce)
        return model


def counted_allreduce(meter: CommMeter, bucket):  # DDP checks a return annotation, which this module's are strings
    """torch's ``default_hooks.allreduce_hook`` (DDP's own all-reduce: divide by the world,
    sum), returning its future of the averaged bucket; counts the bucket's bytes and the
    seconds until its all-reduce completes (under NCCL the future completes when the work
    is queued: the seconds there are the host's)."""
    # heavy: torch.distributed's parts load only when a run uses them
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    buf, t0 = bucket.buffer(), time.perf_counter()
    nbytes = buf.numel() * buf.element_size()

    def done(fut):
        meter.add(time.perf_counter() - t0, nbytes)
        return fut.value()

    return allreduce_hook(None, bucket).then(done)
