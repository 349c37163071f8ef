"""telemetry/device_gpus.py: the UUIDs and PCI addresses of the GPUs a run uses, which the sampler
picks NVML's and amdsmi's by."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from speechperf.telemetry.device_gpus import RunGpu, pci_of_bdf, run_gpus


def _cuda(monkeypatch, n: int = 4, fail=None):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)

    def props(i):
        if fail or not 0 <= i < n:
            raise fail or AssertionError(f"Invalid device id {i}")
        return SimpleNamespace(uuid=f"uuid-{i}", pci_domain_id=0, pci_bus_id=0xc1 + i, pci_device_id=0)

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)


def test_off_cuda_there_is_nothing_to_pick():
    assert run_gpus("cpu") is None and run_gpus(torch.device("cpu"), 2) is None


def test_one_device_or_this_nodes_ranks_devices(monkeypatch):
    _cuda(monkeypatch)
    assert run_gpus("cuda:1") == [RunGpu("uuid-1", "0000:c2:00")]
    assert run_gpus("cuda") == [RunGpu("uuid-2", "0000:c3:00")]  # the current device
    assert [g.uuid for g in run_gpus("cuda:0", local_world=3)] == ["uuid-0", "uuid-1", "uuid-2"]  # rank r on cuda:r


def test_a_torch_without_pci_fields_gives_the_uuid_alone(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid="u"))
    assert run_gpus("cuda:0") == [RunGpu("u", None)]


def test_a_bdf_reads_as_domain_bus_device():
    assert pci_of_bdf("0000:C1:00.0") == "0000:c1:00" and pci_of_bdf(" 0001:03:1f.2\n") == "0001:03:1f"
    assert pci_of_bdf("N/A") is None and pci_of_bdf("0000:zz:00.0") is None and pci_of_bdf("c1:00.0") is None


def test_what_torch_cannot_tell_reads_every_gpu(monkeypatch):
    _cuda(monkeypatch, n=1)
    assert run_gpus("cuda:0", local_world=2) is None  # a rank's GPU not visible here
    _cuda(monkeypatch, fail=AttributeError("no uuid"))
    assert run_gpus("cuda:0") is None


@pytest.mark.cuda
def test_torchs_uuid_finds_nvmls_gpu():
    """On a real GPU: the run's device, named by torch's UUID, is one GPU of NVML's, not every GPU."""
    from speechperf.telemetry.sampler import Sampler, SamplerConfig

    pytest.importorskip("pynvml")
    s = Sampler(config=SamplerConfig(rapl=False), run_gpus=run_gpus("cuda:0"))
    assert len(s.gpu_sources) == 1 and "gpu_selection" not in s.unavailable, s.unavailable


@pytest.mark.cuda
def test_torchs_pci_address_is_the_drivers():
    """On a real GPU: torch's PCI address of the device is the driver's BDF less its function (NVML's
    here; amdsmi's on an AMD GPU, which the sampler matches by it)."""
    pynvml = pytest.importorskip("pynvml")
    mine = run_gpus("cuda:0")[0]
    pynvml.nvmlInit()
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        uuid = pynvml.nvmlDeviceGetUUID(h)
        if str(uuid.decode() if isinstance(uuid, bytes) else uuid).lower().removeprefix("gpu-") == mine.uuid.lower():
            bus = pynvml.nvmlDeviceGetPciInfo(h).busId
            assert pci_of_bdf(bus.decode() if isinstance(bus, bytes) else bus) == mine.pci, (bus, mine)
            return
    pytest.fail(f"torch's {mine} not among NVML's GPUs")
