"""The kernel families' fingerprints: fixed computations whose sha256 tells two machines' kernels apart."""
import hashlib

import torch
import torch.nn.functional as F

from speechperf.studies import curve
from speechperf.hardware import isa_cap, kernel_fingerprint as kf


def test_fingerprints_are_stable_and_leave_the_random_state_and_threads_alone():
    torch.manual_seed(7)
    state, threads = torch.get_rng_state(), torch.get_num_threads()
    a = kf.fingerprints()
    assert torch.equal(torch.get_rng_state(), state) and torch.get_num_threads() == threads
    assert kf.fingerprints() == a
    assert set(a) == {"mm", "conv1d", "conv1d_backward", "lstm", "lstm_backward", "elementwise"}
    assert all(len(v) == kf.DIGITS and int(v, 16) >= 0 for v in a.values())


def test_a_fingerprint_is_the_sha256_of_the_results_bytes():
    g = torch.Generator().manual_seed(kf.SEED)
    a, b = torch.randn(300, 517, generator=g), torch.randn(517, 129, generator=g)
    with kf.one_thread():
        want = hashlib.sha256(torch.mm(a, b).numpy().tobytes()).hexdigest()[:kf.DIGITS]
    assert kf.fingerprints()["mm"] == want
    x = torch.arange(6, dtype=torch.float32)
    assert kf.digest(x, x) == hashlib.sha256(x.numpy().tobytes() * 2).hexdigest()[:kf.DIGITS]


def test_a_fingerprint_sees_one_unit_in_the_last_place():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(2, 93, 50, generator=g), torch.randn(256, 93, 11, generator=g)
    y = F.conv1d(x, w, stride=2)
    z = y.clone().view(-1)
    z[0] = torch.nextafter(z[0], torch.tensor(float("inf")))  # one unit in the last place: another summation order
    assert kf.digest(y) != kf.digest(z) and kf.digest(y) == kf.digest(y.clone())


def test_a_capped_process_records_them_and_an_uncapped_one_does_not(monkeypatch):
    for var in isa_cap.CAP_VARS:
        monkeypatch.delenv(var, raising=False)
    assert isa_cap.effective()["kernels"] is None  # a plain run pays nothing
    for var, value in isa_cap.CAPS["avx2"].items():
        monkeypatch.setenv(var, value)
    assert isa_cap.effective()["kernels"] == kf.fingerprints()


def test_reproduce_names_the_kernel_families_that_compute_otherwise():
    mine = {"threads": 1, "cap": "avx2", "cpu_vendor": "Intel", "torch": "t", "MKL_CBWR": "COMPATIBLE",
            "cpu_capability": "AVX2", "features_sha256": "f", "seed": 1,
            **kf.as_settings({"mm": "a", "lstm": "b", "conv1d": "c"})}
    amd = {**mine, "cpu_vendor": "AMD", "kernel_lstm": "x", "kernel_conv1d": "y"}
    assert kf.differing(mine, amd) == ["conv1d", "lstm"]
    assert curve.comparable(mine, amd) == ("cpu_vendor Intel (reference AMD); "
                                           "kernels that compute otherwise: conv1d, lstm")
    same = {**mine, "cpu_vendor": "AMD"}
    assert curve.comparable(mine, same) == "cpu_vendor Intel (reference AMD); the kernels' fingerprints agree"
    old = {k: v for k, v in amd.items() if not k.startswith(kf.PREFIX)}  # a curve recorded before fingerprints
    assert kf.differing(mine, old) is None and curve.comparable(mine, old) == "cpu_vendor Intel (reference AMD)"
    assert "kernels that compute otherwise: lstm" in curve.differences(mine, {**mine, "kernel_lstm": "z"})
    assert curve.comparable(mine, {**mine, "kernel_lstm": "z"}) is None  # same maker: comparable, it will differ


def test_a_curve_keeps_the_fingerprints_of_its_run():
    env = {"isa": {"cap": "avx2", "kernels": {"mm": "a1", "lstm": "b2"}}, "cpu_model": "AMD EPYC 9B14"}
    got = curve.settings_of({"train": {"seed": 1, "threads": 1}}, env)
    assert got["kernel_mm"] == "a1" and got["kernel_lstm"] == "b2" and got["cpu_vendor"] == "AMD"
    assert all(isinstance(v, (str, int, type(None))) for v in got.values())  # a reference's settings shape
