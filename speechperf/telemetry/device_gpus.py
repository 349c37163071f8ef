"""Which of the node's GPUs a run uses, named so that the vendor library finds them; and how much
memory a GPU can still give this process.

A process numbers only the GPUs ``CUDA_VISIBLE_DEVICES`` leaves it, in CUDA's order, while NVML
numbers every GPU of the node in its own: ``cuda:0`` of a seed given GPU 5 is NVML's 5. Sampling
every GPU instead counts idle neighbours' watts (an idle GPU still draws power) into a one-GPU
run's energy and their idleness into its busy share, and a parallel seed's busy GPU into another
seed's. The UUID names a GPU the same to both (torch's device properties, NVML's
``nvmlDeviceGetUUID``)."""
from __future__ import annotations


def run_gpu_uuids(device, local_world: int = 1) -> list[str] | None:
    """The UUIDs of the GPUs this node's ranks use: rank r on ``cuda:r`` for a world of
    ``local_world`` > 1 ranks here (train/distributed.py's ``pick_device``), else ``device``
    alone. None off CUDA or where torch cannot tell (the sampler then reads every GPU)."""
    import torch  # heavy: only a caller with a device pays for it

    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    indices = range(local_world) if local_world > 1 else [torch.cuda.current_device() if dev.index is None
                                                          else dev.index]
    try:
        return [str(torch.cuda.get_device_properties(i).uuid) for i in indices]
    except (AttributeError, RuntimeError, AssertionError):  # a torch without the field, a device not visible
        return None


def cuda_free_bytes(device) -> int:
    """What a CUDA device can still give this process: the driver's free memory and what this
    process's caching allocator holds unused (the driver counts it used; torch frees such blocks
    for an allocation that needs them: an earlier model's, a measured candidate's)."""
    import torch

    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return torch.cuda.mem_get_info(device)[0] + cached
