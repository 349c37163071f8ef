"""The stored features do not depend on which code path MKL, ATen or oneDNN takes on this CPU:
the same audio gives the same float16 bytes under each kernel setting, each in a child
process (the variables are read when the libraries load)."""
import hashlib
import os
import subprocess
import sys

import pytest

CODE = """
import hashlib, numpy as np, torch
from speechperf.features.extract import extract_batch
from speechperf.features.shards import as_stored
torch.set_num_threads(1)
rng = np.random.default_rng(5)
waves = []
for n in (4000, 17000, 31000):  # integer noise with a silent start: MFCCs that are exactly zero
    w = (np.cumsum(rng.integers(-900, 900, n)) % 20000 - 10000).astype(np.float32) / 32768
    w[: n // 4] = 0
    waves.append(w)
print(hashlib.sha256(as_stored(np.concatenate(extract_batch(waves))).tobytes()).hexdigest())
"""
SETTINGS = {"MKL's vendor-independent path": {"MKL_CBWR": "COMPATIBLE"},
            "ATen's default kernels": {"ATEN_CPU_CAPABILITY": "default"},
            "the whole AVX2 cap": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
                                   "MKL_CBWR": "COMPATIBLE"}}


def _hash(extra: dict) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}
    out = subprocess.run([sys.executable, "-c", CODE], env={**env, **extra}, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.skipif("avx2" not in open("/proc/cpuinfo").read() if sys.platform == "linux" else True,
                    reason="the AVX2 cap needs a CPU with AVX2")
def test_the_stored_features_are_the_same_under_every_kernel_setting():
    plain = _hash({})
    assert len(plain) == len(hashlib.sha256().hexdigest())
    for name, extra in SETTINGS.items():
        assert _hash(extra) == plain, f"the stored features change under {name} ({extra})"
