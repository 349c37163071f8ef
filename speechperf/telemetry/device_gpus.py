"""Which of the node's GPUs a run uses, named so that the vendor library finds them; and how much
memory a GPU can still give this process.

A process numbers only the GPUs ``CUDA_VISIBLE_DEVICES`` (``HIP_VISIBLE_DEVICES``) leaves it, in
its runtime's order, while NVML and amdsmi number every GPU of the node in their own: ``cuda:0``
of a seed given GPU 5 is NVML's 5. Sampling every GPU instead counts idle neighbours' watts (an
idle GPU still draws power) into a one-GPU run's energy and their idleness into its busy share,
and a parallel seed's busy GPU into another seed's. Two names are the same to both sides: the
UUID (torch's device properties, NVML's ``nvmlDeviceGetUUID``), and the PCI address (torch's
``pci_domain_id``, ``pci_bus_id``, ``pci_device_id``; amdsmi's ``amdsmi_get_gpu_device_bdf``).
NVML is matched by UUID; amdsmi by PCI address, since ROCm's HIP UUID and amdsmi's UUID are not
formed alike."""
from __future__ import annotations

from typing import NamedTuple


class RunGpu(NamedTuple):
    """One GPU of the run, as the sampler finds it in the vendor library."""
    uuid: str | None  # torch's UUID of the device (NVML's without its "GPU-"), None where torch has none
    pci: str | None  # "dddd:bb:dd": PCI domain, bus and device in hex, lower case, as in a BDF; None: unknown


def run_gpus(device, local_world: int = 1) -> list[RunGpu] | None:
    """The GPUs this node's ranks use: rank r on ``cuda:r`` for a world of ``local_world`` > 1
    ranks here (train/distributed.py's ``pick_device``), else ``device`` alone. None off CUDA or
    where torch cannot tell (the sampler then reads every GPU)."""
    import torch  # heavy: only a caller with a device pays for it

    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    indices = range(local_world) if local_world > 1 else [torch.cuda.current_device() if dev.index is None
                                                          else dev.index]
    try:
        return [_identity(torch.cuda.get_device_properties(i)) for i in indices]
    except (AttributeError, RuntimeError, AssertionError):  # a torch without the field, a device not visible
        return None


def _identity(props) -> RunGpu:
    uuid = getattr(props, "uuid", None)
    where = [getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device")]
    pci = (None if any(not isinstance(x, int) for x in where)
           else f"{where[0]:04x}:{where[1]:02x}:{where[2]:02x}")
    return RunGpu(None if uuid is None else str(uuid), pci)


def pci_of_bdf(bdf) -> str | None:
    """"dddd:bb:dd" of a BDF string ("0000:C1:00.0": domain, bus, device, function), None if it is
    not one."""
    text = str(bdf).strip().lower()
    head, _, _function = text.rpartition(".")
    parts = head.split(":")
    if len(parts) != 3 or not all(parts):
        return None
    try:
        domain, bus, dev = (int(p, 16) for p in parts)
    except ValueError:
        return None
    return f"{domain:04x}:{bus:02x}:{dev:02x}"


def pick_runs(handles: list, want: set[str] | None, name_of, library: str, names: tuple[str, str],
              unavailable: dict) -> list:
    """Of a library's ``handles`` ([(index, handle)]), those whose name ``name_of(handle)`` is one of
    ``want``: the run's GPUs as that library names them (None: torch could not name one).
    ``names``: (torch's name, the library's), for the reasons. Where torch or the library gives no
    name, or one of ``want`` is not found: every handle, and why in ``unavailable["gpu_selection"]``
    (energy then counts every GPU of the node, and the run's summary says so)."""
    if want is None:
        unavailable["gpu_selection"] = f"every GPU sampled: torch gave no {names[0]} for the run's GPU(s)"
        return handles
    try:
        have = {i: name_of(h) for i, h in handles}
    except Exception as e:  # a library without the call, an old driver, a refused reading
        unavailable["gpu_selection"] = f"every GPU sampled: {library} gave no {names[1]} ({type(e).__name__}: {e})"
        return handles
    picked = [(i, h) for i, h in handles if have[i] in want]
    if len(picked) != len(want):
        unavailable["gpu_selection"] = (f"every GPU sampled: the run's GPU(s) {', '.join(sorted(want))} not all among "
                                        f"{library}'s ({', '.join(str(n) for n in have.values())})")
        return handles
    return picked


def cuda_free_bytes(device) -> int:
    """What a CUDA device can still give this process: the driver's free memory and what this
    process's caching allocator holds unused (the driver counts it used; torch frees such blocks
    for an allocation that needs them: an earlier model's, a measured candidate's)."""
    import torch

    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return torch.cuda.mem_get_info(device)[0] + cached
