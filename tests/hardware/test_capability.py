"""Precision capability: native, emulated or unsupported, decided from the CPU's flags and a
cached probe; each path proven on any CPU by forcing flags off (env var or monkeypatch)."""
import pytest
import torch

from speechperf.config import load_preset
from speechperf.errors import in_words
from speechperf.hardware import capability as cap

AVX2 = frozenset({"sse", "sse2", "avx", "avx2", "fma"})
AVX512 = AVX2 | cap.AVX512_CORE
ONEDNN = ("could not create a primitive descriptor for the LSTM forward propagation primitive. Run workload with "
          "environment variable ONEDNN_VERBOSE=all to get additional diagnostic information.")


@pytest.fixture
def cpu(monkeypatch):
    """Pretend to be a CPU with the given flags; probes answer as that CPU would."""
    def set_flags(flags, lstm_error=None):
        monkeypatch.setattr(cap, "_real_cpu_flags", lambda: frozenset(flags))
        monkeypatch.setattr(cap, "probe", lambda kernel, dtype: lstm_error if kernel == "lstm" else None)
    return set_flags


def test_lstm_under_bf16_without_avx512_is_unsupported_in_words(cpu):
    cpu(AVX2, lstm_error=in_words(ONEDNN))
    s = cap.support("cpu", "bf16", torch.nn.LSTM(4, 4))
    assert (s.level, s.runs) == ("unsupported", False)
    assert s.note == "unsupported on this CPU: torch's oneDNN LSTM has no bf16 kernel without AVX-512 (this CPU: AVX2)"
    linear = cap.support("cpu", "bf16", torch.nn.Linear(4, 4))  # matrix products still run, converted
    assert linear.runs and linear.note == "emulated: no native bf16 on this CPU (AVX2)"
    assert cap.support("cpu", "fp32", torch.nn.LSTM(4, 4)).note is None
    projected = cap.support("cpu", "bf16", torch.nn.LSTM(4, 4, proj_size=2))  # torch's own kernel, not oneDNN's
    assert projected.note == "emulated: no native bf16 on this CPU (AVX2)"


def test_avx512_without_bf16_units_is_emulated_and_amx_is_native(cpu):
    cpu(AVX512)
    s = cap.support("cpu", "bf16", torch.nn.LSTM(4, 4))
    assert s.level == "emulated" and s.note == "emulated: no native bf16 on this CPU (AVX-512)"
    cpu(AVX512 | {"avx512_bf16", "amx_bf16", "amx_tile"})
    assert cap.support("cpu", "bf16", torch.nn.LSTM(4, 4)).level == "native"
    assert cap.support("cpu", "bf16").note is None


def test_a_failing_probe_overrules_the_flags(cpu):
    cpu(AVX512, lstm_error="could not create a primitive descriptor for the LSTM forward propagation primitive")
    s = cap.support("cpu", "bf16", torch.nn.LSTM(4, 4))
    assert s.level == "unsupported" and "fails under bf16 (could not create a primitive descriptor" in s.reason


def test_the_env_var_forces_a_flag_off_without_probing(monkeypatch):
    monkeypatch.setattr(cap, "_real_cpu_flags", lambda: AVX512 | {"avx512_bf16"})
    monkeypatch.setenv(cap.FORCE_ENV, "avx512f, avx512_bf16")
    probed = []
    monkeypatch.setattr(cap, "probe", lambda kernel, dtype: probed.append(kernel))
    assert "avx512f" not in cap.cpu_flags() and cap.isa(cap.cpu_flags()) == "AVX2"
    s = cap.support("cpu", "bf16", torch.nn.LSTM(4, 4))
    assert s.level == "unsupported" and s.reason.endswith("without AVX-512 (this CPU: AVX2)")
    assert probed == ["matmul"]  # the LSTM's answer comes from the forced flags, not this CPU


def test_the_probe_agrees_with_this_cpus_flags_and_leaves_the_rng_alone():
    cap.probe.cache_clear()
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    lstm_error = cap.probe("lstm", "bf16")
    assert torch.equal(torch.rand(2), expected)  # the probe's LSTM initialization drew from a forked stream
    assert (lstm_error is None) == (cap.AVX512_CORE <= cap._real_cpu_flags()), lstm_error
    assert cap.probe("matmul", "bf16") is None  # bf16 products run on every CPU torch supports
    assert cap.probe.cache_info().currsize == 2


def test_gpu_rules_from_compute_capability(monkeypatch):
    monkeypatch.setattr(cap, "cuda_capability", lambda device: (7, 0))  # V100
    assert cap.support("cuda:0", "bf16").note == "emulated: no native bf16 on this GPU (compute capability 7.0; " \
                                                 "8.0 or newer has it)"
    assert cap.support("cuda:0", "tf32").note.startswith("unsupported on this GPU: tf32 needs compute capability 8.0")
    assert cap.support("cuda:0", "fp16").level == "native"
    monkeypatch.setattr(cap, "cuda_capability", lambda device: (9, 0))  # H100
    assert {cap.support("cuda:0", p, torch.nn.LSTM(4, 4)).level for p in cap.KNOWN if p != "fp8"} == {"native"}
    # native, but a model's LSTMs run in fp16 under bf16 autocast: the run's note says so
    lstm_model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LSTM(4, 4))
    assert cap.support("cuda:0", "bf16", lstm_model).note.startswith("its LSTMs run in fp16 under bf16 autocast")
    assert cap.support("cuda:0", "bf16", torch.nn.Linear(4, 4)).note is None
    assert cap.support("cuda:0", "fp16", lstm_model).note is None and cap.support("cuda:0", "bf16").note is None
    with pytest.raises(ValueError, match="unknown precision 'int8'"):
        cap.support("cpu", "int8")


def test_a_model_config_is_inspected_on_the_meta_device(cpu):
    from speechperf.config import load_preset

    cpu(AVX2, lstm_error="no kernel")
    assert not cap.model_support(load_preset("tiny").model, "cpu", "bf16").runs  # DS2: LSTM layers


def test_errors_in_words_keep_whole_words():
    assert in_words(RuntimeError(ONEDNN)) == "could not create a primitive descriptor for the LSTM forward " \
                                             "propagation primitive"
    long = in_words("word " * 60, limit=22)
    assert long == "word word word word..." and len(long) <= 25
    assert in_words(RuntimeError("")) == "RuntimeError"


@pytest.mark.cuda
def test_the_lstm_note_holds_for_this_torch():
    """What CUDNN_RNN_FP16 claims, on the GPU: cuDNN's LSTM under bf16 autocast returns fp16 while
    a linear layer returns bf16 (if torch changes this, the note must go)."""
    lstm, x = torch.nn.LSTM(16, 16).cuda(), torch.randn(5, 3, 16, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y, _ = lstm(x)
        z = torch.nn.functional.linear(x, lstm.weight_ih_l0)
    assert (y.dtype, z.dtype) == (torch.float16, torch.bfloat16)


FP8_MODEL = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 30))
FP8_SWAP = "1 of 2 Linear layers in float8, the others in bf16 (2: out_features 30 not a multiple of 16)"


def test_fp8_is_native_only_from_compute_capability_8_9(monkeypatch):
    for cc, level in (((8, 0), "unsupported"), ((8, 6), "unsupported"), ((8, 9), "native"), ((9, 0), "native"),
                      ((10, 0), "native")):
        monkeypatch.setattr(cap, "cuda_capability", lambda device, cc=cc: cc)
        assert cap.support("cuda:0", "fp8", FP8_MODEL).level == level, cc
    monkeypatch.setattr(cap, "cuda_capability", lambda device: (8, 0))  # A100
    assert cap.support("cuda:0", "fp8", FP8_MODEL).note == ("unsupported on this GPU: no FP8 tensor cores on this GPU "
                                                            "(compute capability 8.0; 8.9 or newer has them)")
    monkeypatch.setattr(cap, "cuda_capability", lambda device: (9, 0))  # H100: the swap is the note
    assert cap.support("cuda:0", "fp8", FP8_MODEL).note == FP8_SWAP


def test_fp8_on_a_cpu_is_emulated_and_unsupported_where_its_bf16_or_its_layers_are(cpu):
    cpu(AVX512 | {"avx512_bf16", "amx_bf16", "amx_tile"})  # bf16 native: fp8 is still emulated on a CPU
    s = cap.support("cpu", "fp8", FP8_MODEL)
    assert s.level == "emulated" and s.note == ("emulated: no FP8 tensor cores on a CPU (AVX-512 with AMX): torchao "
                                                f"emulates the float8 casts, its products run in fp32; {FP8_SWAP}")
    cpu(AVX2, lstm_error="no kernel")  # DS2-like: an LSTM under bf16 autocast has no kernel here
    lstm = torch.nn.Sequential(torch.nn.LSTM(32, 32), torch.nn.Linear(32, 32))
    assert cap.support("cpu", "fp8", lstm).note == ("unsupported on this CPU: its bf16 autocast does not run: torch's "
                                                    "oneDNN LSTM has no bf16 kernel without AVX-512 (this CPU: AVX2)")
    s = cap.support("cpu", "fp8", torch.nn.Linear(32, 30))
    assert s.level == "unsupported" and s.reason == (
        "no Linear layer of this model can train in float8 (the model: out_features 30 not a multiple of 16): it would "
        "train in bf16")
    assert cap.model_support(load_preset("tiny").model, "cpu", "fp8").reason.startswith(
        "no Linear layer of this model can train in float8 (fc: out_features 30 not a multiple of 16)")


def test_fp8_without_torchao_is_unsupported_naming_the_extra(cpu, monkeypatch):
    from speechperf.models import fp8

    cpu(AVX512)
    monkeypatch.setattr(fp8, "available", lambda: "train.system.precision=fp8 needs torchao (...): " + fp8.EXTRA)
    for device in ("cpu", "cuda:0"):
        s = cap.support(device, "fp8", FP8_MODEL)
        assert s.level == "unsupported" and s.reason.endswith("pip install 'speechperf[fp8]' (torchao)")
