"""The instruction-set cap: the environment that holds every CPU kernel library torch runs to
one x86 instruction set, and the effective values a process ran under.

torch's CPU arithmetic comes from two dispatchers, each choosing its kernels once per process
from the CPU it finds: oneDNN (convolutions, LSTM, some matrix products), capped by
``ONEDNN_MAX_CPU_ISA``, and ATen's own vectorized kernels (elementwise, reductions, softmax,
norms), capped by ``ATEN_CPU_CAPABILITY``. Capping only oneDNN is half a cap: on an AVX-512
machine ATen's kernels still sum in 16-float vectors, and a training curve differs from an
AVX2 machine's from the first epoch; capping both reproduced the AVX2 reference
bit for bit. A third library, MKL, computes torch's float32 matrix products (``torch.mm``,
linear layers) and FFTs; it dispatches on the CPU's vendor as well as its instruction set (an
AMD CPU takes MKL's generic code, an Intel one its own kernels), so ``MKL_CBWR`` (MKL's
conditional numerical reproducibility) fixes its code path too: ``COMPATIBLE`` is the branch
MKL documents as giving the same results on Intel and non-Intel CPUs. All three variables are
read when the libraries load (ATen's at ``import torch``, MKL's at its first call), so a cap
only takes effect in a child process started with :func:`cap_env`'s environment.

:func:`effective` says what a process actually ran: torch's capability, oneDNN's ISA (torch
exposes no getter for it: it is read from the header oneDNN prints once per process when its
verbose mode is first switched on), oneDNN's version and the two variables as set.
"""
from __future__ import annotations

import functools
import os
import re
import sys
import tempfile

ONEDNN_VAR, ATEN_VAR, MKL_VAR = "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_CBWR"
CAP_VARS = (ONEDNN_VAR, ATEN_VAR, MKL_VAR)  # every variable a cap sets
MKL_BRANCH = "COMPATIBLE"  # MKL's vendor-independent code path (see the module's docstring)
# --isa NAME -> the value of each variable (oneDNN's names: dnnl_cpu_isa_t; ATen's: its
# CPU_CAPABILITY names, lower case; MKL's: its MKL_CBWR branches)
CAPS = {"avx2": {ONEDNN_VAR: "AVX2", ATEN_VAR: "avx2", MKL_VAR: MKL_BRANCH},
        "avx512": {ONEDNN_VAR: "AVX512_CORE", ATEN_VAR: "avx512", MKL_VAR: MKL_BRANCH}}


class UnknownCap(ValueError):
    """An ISA cap speechperf does not know (names it and the known ones)."""


def cap_vars(isa: str) -> dict:
    """The variables that cap the process to ``isa`` (a :data:`CAPS` key)."""
    try:
        return dict(CAPS[isa])
    except KeyError:
        raise UnknownCap(f"unknown ISA cap {isa!r}: one of {', '.join(sorted(CAPS))}") from None


def cap_env(isa: str | None, base: dict | None = None) -> dict:
    """The environment of a child process capped to ``isa``: ``base`` (default ``os.environ``)
    with every variable of the cap set; ``isa`` None: ``base`` as it is (no cap: the machine's own kernels)."""
    env = dict(os.environ if base is None else base)
    if isa is None:
        return env
    env.update(cap_vars(isa))
    return env


def cap_of(env: dict) -> str | None:
    """The :data:`CAPS` key that ``env`` sets whole, None when it sets none of its variables; a
    part of a cap or an unknown one is named as ``"partial: VAR=VALUE ..."``."""
    set_ = {k: env.get(k) for k in CAP_VARS if env.get(k)}
    if not set_:
        return None
    for name, values in CAPS.items():
        if {k: v.lower() for k, v in set_.items()} == {k: v.lower() for k, v in values.items()}:
            return name
    return "partial: " + " ".join(f"{k}={v}" for k, v in sorted(set_.items()))


@functools.lru_cache(maxsize=1)
def onednn_isa() -> str | None:
    """oneDNN's ISA in this process ("Intel AVX2"), None where it did not say (it prints its
    header once per process: a process that ran with ONEDNN_VERBOSE set already printed it)."""
    import torch

    if not torch.backends.mkldnn.is_available():
        return None
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as f:
        try:
            os.dup2(f.fileno(), 1)  # oneDNN prints from C to file descriptor 1
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                # a convolution large enough to take oneDNN's path: [2, 8, 16, 16] * [16, 8, 3, 3]
                torch.nn.functional.conv2d(torch.ones(2, 8, 16, 16), torch.ones(16, 8, 3, 3))
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        f.seek(0)
        text = f.read().decode(errors="replace")
    found = re.search(r"info,cpu,isa:([^\n]*)", text)
    return found.group(1).strip() if found else None


def onednn_version() -> str | None:
    """oneDNN's version as torch's build reports it ("3.12.0"), None where it is not there."""
    import torch

    found = re.search(r"(?:MKL-DNN|oneDNN) v([\w.]+)", torch.__config__.show())
    return found.group(1) if found else None


def mkl_version() -> str | None:
    """MKL's version as torch's build reports it ("2024.2-Product Build 20240605"), None where
    torch was built without it."""
    import torch

    found = re.search(r"Math Kernel Library Version ([^\n]+?) for", torch.__config__.show())
    return found.group(1).strip() if found else None


def effective() -> dict:
    """The kernels this process runs: {"cpu_capability", "onednn_isa", "onednn", "mkl", "cap",
    ONEDNN_VAR, ATEN_VAR, MKL_VAR (as set, None when not), "kernels"} (under a cap, the fingerprint of
    each kernel family: hardware/kernel_fingerprint.py; None without one)."""
    import torch

    from speechperf.hardware.kernel_fingerprint import fingerprints  # loads torch: only where a run records this

    cap = cap_of(os.environ)
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "onednn_isa": onednn_isa(),
            "onednn": onednn_version(), "mkl": mkl_version(), "cap": cap,
            **{var: os.environ.get(var) for var in CAP_VARS},
            "kernels": fingerprints() if cap else None}  # which kernel families compute otherwise on two machines


def exec_capped(isa: str | None, argv: list[str]) -> None:
    """Run this speechperf command again under the cap (``--isa`` of train and demo): the
    variables only take effect at process start, so the process replaces itself with
    ``python -m speechperf ARGV`` in the capped environment. Returns at once when ``isa`` is
    None or the environment already sets this cap whole (the process after the replacement)."""
    if isa is None or cap_of(os.environ) == isa:
        return
    env = cap_env(isa)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "speechperf", *argv], env)
