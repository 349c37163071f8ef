"""The environment recorded with every result: hardware, OS and library versions."""
from __future__ import annotations

import os
import platform
import socket
from importlib import metadata
from speechperf.telemetry.sampler import availability

LIBRARIES = ("torch", "numpy", "scipy", "soundfile", "rapidfuzz", "psutil", "nvidia-ml-py", "amdsmi",
             "mlperf-logging", "matplotlib", "espeakng-loader", "speechperf")


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (platform.processor() is often empty)."""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpus() -> list[dict]:
    """Name, memory and driver of every CUDA device, through torch and NVML when present; on
    ROCm (``torch.version.hip``: its build runs the ``cuda`` device API on AMD GPUs) the
    architecture (``gfx942``) and the driver through amdsmi. The names are what platform
    profiles match (``gpu_names``: "AMD Instinct MI300X")."""
    import torch

    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append({"index": i, "name": p.name, "memory_gb": round(p.total_memory / 2**30, 2),
                    "capability": f"{p.major}.{p.minor}"})
        if torch.version.hip:
            out[-1]["arch"] = getattr(p, "gcnArchName", None)
    driver = _driver(bool(torch.version.hip))
    for g in out:
        g["driver"] = driver
    return out


def _driver(rocm: bool) -> str:
    """The GPU driver's version from NVML, or from amdsmi on ROCm; why not, where it cannot say."""
    try:
        if rocm:
            import contextlib
            import io

            with contextlib.redirect_stdout(io.StringIO()):  # amdsmi prints when libamd_smi.so is missing
                import amdsmi
            amdsmi.amdsmi_init(amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS)
            return amdsmi.amdsmi_get_gpu_driver_info(amdsmi.amdsmi_get_processor_handles()[0])["driver_version"]
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        return driver.decode() if isinstance(driver, bytes) else driver
    except Exception as e:  # the library absent or refusing: recorded, not fatal
        return f"unavailable ({type(e).__name__})"


def cloud_instance(dmi: str = "/sys/class/dmi/id") -> dict | None:
    """The machine's DMI vendor and product name ({"vendor", "product"}), None where unreadable.

    On EC2 Nitro instances they are "Amazon EC2" and the instance type ("m7i.xlarge"): the
    one local, honest way to know which cloud instance a CPU-only run was priced on.
    """
    try:
        vendor = open(f"{dmi}/sys_vendor", encoding="utf-8").read().strip()
        product = open(f"{dmi}/product_name", encoding="utf-8").read().strip()
    except OSError:
        return None
    return {"vendor": vendor, "product": product}


def capture_env(device: str = "cpu") -> dict:
    """A JSON-serializable description of this machine and software."""
    import psutil
    import torch

    versions = {}
    for lib in LIBRARIES:
        try:
            versions[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            versions[lib] = None
    return {
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": cpu_model(),
        "cpu_cores_physical": psutil.cpu_count(logical=False),
        "cpu_cores_logical": psutil.cpu_count(logical=True),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 2),
        "device": device,
        "gpus": gpus(),
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),  # ROCm's torch build: AMD GPUs behind the cuda API
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "torch_threads": torch.get_num_threads(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "isa": _isa(),  # the kernels it ran: torch's capability, oneDNN's ISA, the cap variables
        "libraries": versions,
        "telemetry": _telemetry(),
        "cloud_instance": cloud_instance(),
    }


def _isa() -> dict:
    """hardware/isa_cap.py's effective values; a failure is recorded, never fatal."""
    from speechperf.hardware.isa_cap import effective

    try:
        return effective()
    except Exception as e:  # capture_env must never fail a run
        return {"error": f"{type(e).__name__}: {e}"}


def _telemetry() -> dict:
    """Which power/energy sources the sampler can read here, and why not the others."""
    try:
        return availability()
    except Exception as e:  # capture_env must never fail a run: the failure itself is recorded
        return {"gpus": 0, "gpu_library": None, "rapl_zones": {},
                "unavailable": {"telemetry": f"{type(e).__name__}: {e}"}}
