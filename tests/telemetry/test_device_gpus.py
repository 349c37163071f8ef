"""telemetry/device_gpus.py: the UUIDs of the GPUs a run uses, which the sampler picks NVML's by."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from speechperf.telemetry.device_gpus import run_gpu_uuids


def _cuda(monkeypatch, n: int = 4, fail=None):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)

    def props(i):
        if fail or not 0 <= i < n:
            raise fail or AssertionError(f"Invalid device id {i}")
        return SimpleNamespace(uuid=f"uuid-{i}")

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)


def test_off_cuda_there_is_nothing_to_pick():
    assert run_gpu_uuids("cpu") is None and run_gpu_uuids(torch.device("cpu"), 2) is None


def test_one_device_or_this_nodes_ranks_devices(monkeypatch):
    _cuda(monkeypatch)
    assert run_gpu_uuids("cuda:1") == ["uuid-1"]
    assert run_gpu_uuids("cuda") == ["uuid-2"]  # the current device
    assert run_gpu_uuids("cuda:0", local_world=3) == ["uuid-0", "uuid-1", "uuid-2"]  # rank r on cuda:r


def test_what_torch_cannot_tell_reads_every_gpu(monkeypatch):
    _cuda(monkeypatch, n=1)
    assert run_gpu_uuids("cuda:0", local_world=2) is None  # a rank's GPU not visible here
    _cuda(monkeypatch, fail=AttributeError("no uuid"))
    assert run_gpu_uuids("cuda:0") is None


@pytest.mark.cuda
def test_torchs_uuid_finds_nvmls_gpu():
    """On a real GPU: the run's device, named by torch's UUID, is one GPU of NVML's, not every GPU."""
    from speechperf.telemetry.sampler import Sampler, SamplerConfig

    pytest.importorskip("pynvml")
    s = Sampler(config=SamplerConfig(rapl=False), gpu_uuids=run_gpu_uuids("cuda:0"))
    assert len(s.gpu_sources) == 1 and "gpu_selection" not in s.unavailable, s.unavailable
