"""A FastConformer run whose step would not fit the device is refused before the run exists, naming
the gigabytes and what would fit; models without a memory rule are not checked."""
import pytest
import torch

from speechperf.config import load_preset
from speechperf.data.batching import Batching
from speechperf.data.index import librispeech_like
from speechperf.hardware.memory import GB, DoesNotFit
from speechperf.train.trainer import check_fits_device

CPU = torch.device("cpu")


def test_an_xl_run_on_a_small_device_is_refused_naming_what_would_fit():
    cfg = load_preset("fastconformer-xl", ["train.system.precision=fp32"])
    index = librispeech_like(0, splits=(400,))
    with pytest.raises(DoesNotFit, match=r"needs [\d.]+ GB per device \(parameters .* 16\.0 GB free; what would fit: "
                                         r"batches of at most"):
        check_fits_device(cfg, Batching(cfg.loader), index, CPU, 1, False, free_bytes=16 * GB)
    check_fits_device(cfg, Batching(cfg.loader), index, CPU, 1, False, free_bytes=10_000 * GB)  # fits: nothing said


def test_a_model_without_a_memory_rule_is_not_checked():
    cfg = load_preset("tiny")
    check_fits_device(cfg, Batching(cfg.loader), librispeech_like(0, splits=(50,)), CPU, 1, False, free_bytes=1)


def test_the_ranks_on_one_cpu_host_share_its_memory(monkeypatch):
    import psutil

    cfg = load_preset("fastconformer-l", ["train.system.precision=fp32", "loader.max_duration=30"])  # ~2 GB a rank
    index = librispeech_like(0, splits=(400,))
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("VM", (), {"available": 30 * GB})())
    check_fits_device(cfg, Batching(cfg.loader), index, CPU, 2, True)  # one rank here: the host's 30 GB
    with pytest.raises(DoesNotFit, match=r"the device has 0\.9 GB free"):  # 32 ranks: 30 / 32 GB each
        check_fits_device(cfg, Batching(cfg.loader), index, CPU, 32, True, local_ranks=32)
