"""How a recorded environment (``capture_env``, a run's env.json) names its machine: the one
rule behind run labels ("H100x1", "2-core EPYC"), platform descriptions and price matching.

Two GPU counts, each with its one definition here, because they answer two questions:

- :func:`gpus_used`: GPUs the run computed on: one per process (``world_size``) on a CUDA
  run, none on a CPU run even where the machine has GPUs. Labels show it.
- :func:`gpu_count`: GPUs the run paid for: the GPUs its machine recorded (4 processes on a
  rented 8-GPU machine pay for 8), or ``world_size`` where that is more (the run spanned
  several machines and rank 0 recorded only its own). Prices scale with it.
"""
from __future__ import annotations

GPU_VENDOR_WORDS = {"nvidia", "amd", "geforce", "tesla", "quadro", "instinct", "radeon", "intel"}
CPU_FAMILIES = ("xeon", "epyc", "ryzen", "threadripper", "core", "graviton", "neoverse", "ampere", "apple", "power")
AWS_VENDOR = "Amazon EC2"  # DMI sys_vendor of EC2 instances, whose DMI product_name is the instance type


def short_gpu(name: str) -> str:
    """"NVIDIA H100 80GB HBM3" -> "H100", "NVIDIA GeForce RTX 4090" -> "RTX4090", "AMD Instinct MI300X" -> "MI300X"."""
    words = [w for w in name.replace("(R)", "").split() if w.lower() not in GPU_VENDOR_WORDS]
    if not words:
        return "GPU"
    if words[0].upper() in ("RTX", "GTX") and len(words) > 1:
        return words[0] + words[1]
    return words[0].split("-")[0]


def short_cpu(model: str | None) -> str:
    """"Intel(R) Xeon(R) CPU @ 2.20GHz" -> "Xeon", "AMD EPYC 7B13" -> "EPYC"."""
    words = (model or "").replace("(R)", "").replace("(TM)", "").replace("(tm)", "").split()
    for w in words:
        if w.lower() in CPU_FAMILIES:
            return w
    rest = [w for w in words if w.lower() not in ("intel", "amd", "cpu")]
    return rest[0] if rest else "CPU"


def gpu_models(env: dict) -> dict[str, int]:
    """{GPU name: how many} the machine recorded, in recorded order."""
    names: dict[str, int] = {}
    for g in env.get("gpus") or []:
        names[g.get("name", "GPU")] = names.get(g.get("name", "GPU"), 0) + 1
    return names


def gpus_used(env: dict) -> int:
    """GPUs the run computed on: one per process on a CUDA run, 0 on a CPU run."""
    if env.get("gpus") and str(env.get("device", "")).startswith("cuda"):
        return env.get("world_size") or 1
    return 0


def gpu_count(env: dict) -> tuple[int, str | None]:
    """GPUs a run paid for and, when that is not simply the GPUs its machine recorded, why.

    Training puts one process on each GPU (cuda:LOCAL_RANK), so a world larger than the
    GPUs rank 0's machine recorded spanned several machines: it used ``world_size`` GPUs.
    """
    n = len(env.get("gpus") or [])
    world = env.get("world_size") or 1
    if n and world > n:
        return world, f"world_size {world} > the {n} GPUs recorded on rank 0's machine: {world} GPUs, one per process"
    return n, None


def machine_name(env: dict) -> str:
    """The short name in run labels: GPU model x GPUs used on a GPU run, else cores and CPU family."""
    used = gpus_used(env)
    if used:
        return f"{short_gpu(env['gpus'][0].get('name', 'GPU'))}x{used}"
    cores = env.get("cpu_affinity") or env.get("cpu_cores_logical")
    return f"{cores}-core {short_cpu(env.get('cpu_model'))}" if cores else short_cpu(env.get("cpu_model"))


def instance_type(env: dict) -> str | None:
    """The EC2 instance type a run recorded (DMI), None elsewhere: no other cloud says it locally."""
    cloud = env.get("cloud_instance") or {}
    return cloud.get("product") if cloud.get("vendor") == AWS_VENDOR and cloud.get("product") else None


def hardware(env: dict) -> str:
    """The machine in words, for messages: its GPUs ("2x NVIDIA L4"), else its CPU model (and EC2 instance)."""
    if env.get("gpus"):
        return " + ".join(f"{n}x {name}" for name, n in gpu_models(env).items())
    instance = instance_type(env)
    cpu = env.get("cpu_model") or "unknown CPU"
    return f"{cpu} ({AWS_VENDOR} {instance})" if instance else cpu


def devices(env: dict) -> tuple[str, str]:
    """(display name, devices in words) of the recorded machine: all its GPUs, its CPU and memory."""
    gpu_text = ", ".join(f"{n}x {name}" for name, n in gpu_models(env).items()) or "no GPU"
    cpu = env.get("cpu_model") or "unknown CPU"
    cores = env.get("cpu_cores_logical")
    memory = env.get("memory_gb")
    words = (f"{gpu_text}, {cpu}" + (f" ({cores} logical cores)" if cores else "")
             + (f", {memory:g} GB" if memory else ""))
    return (f"{gpu_text} / {cpu}" if env.get("gpus") else cpu), words
