"""benchmarks/bench_attention.py: the preset's attention shapes, a real CPU run (both paths, the
backend that ran, their accuracy) and its argument handling."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from speechperf.config import load_preset

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
spec = importlib.util.spec_from_file_location("bench_attention", ROOT / "benchmarks" / "bench_attention.py")
ba = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ba)


def test_shapes_follow_the_preset():
    """1600 s of padded audio per batch, 10 ms frames, 4x subsampling: 400 utterances of 100 frames
    at 4 s, 129 of 310 at LibriSpeech's mean 12.4 s; a batch given wins."""
    cfg = load_preset("conformer")
    assert ba.shape(cfg, 4.0, None) == (400, 100)
    assert ba.shape(cfg, 12.4, None) == (129, 310)
    assert ba.shape(cfg, 4.0, 8) == (8, 100)


def test_a_cpu_run_times_both_paths(capsys):
    assert ba.main(["--device", "cpu", "--seconds", "0.4", "--batch", "3", "--repeats", "1", "--warmup", "0",
                    "--threads", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["device"], out["dtype"], out["dropout"]) == ("cpu", "fp32", 0.1)
    plain, padded = out["rows"]
    assert (plain["path"], plain["head dim seen"], padded["path"], padded["head dim seen"]) == ("unpadded", 44, "padded", 48)
    assert (plain["B"], plain["T"], plain["H"]) == (3, 10, 4)
    assert plain["sdpa op"] == padded["sdpa op"] == "attention_math"  # dropout 0.1: torch's CPU kernel takes none
    assert plain["kernel family"] == plain["fused allowed"] == "n/a"
    assert 0 < plain["max err"] < 1e-5 and 0 < padded["max err"] < 1e-5  # against fp64
    assert plain["unpadded / padded"] is None
    assert padded["unpadded / padded"] == pytest.approx(plain["F+B ms"] / padded["F+B ms"])
    assert plain["x16 layers ms"] == pytest.approx(16 * plain["F+B ms"])


def test_the_table_names_the_fused_cpu_kernel_without_dropout(capsys):
    """conformer-cpu has no attention dropout: torch's fused CPU kernel runs, padded or not."""
    assert ba.main(["--preset", "conformer-cpu", "--device", "cpu", "--seconds", "0.4", "--batch", "2",
                    "--repeats", "1", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("preset conformer-cpu: torch ") and "unpadded / padded" in out
    assert out.count("flash_attention_for_cpu") == 2


@pytest.mark.parametrize("args, message", [
    (["--preset", "no-such-preset"], "unknown preset"),
    (["--preset", "tiny"], "not a conformer"),
    (["--seconds", "4", "0"], "--seconds 0.0: must be > 0"),
    (["--repeats", "0"], "--repeats 0: must be >= 1"),
    (["--batch", "0"], "--batch 0: must be >= 1"),
])
def test_bad_input_exits_2(args, message, capsys):
    assert ba.main(["--device", "cpu", *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="refused only where torch sees no CUDA device")
def test_cuda_without_a_device_exits_2(capsys):
    assert ba.main(["--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_an_unknown_choice_is_argparse_exit_2():
    with pytest.raises(SystemExit) as e:
        ba.main(["--dtype", "fp8"])
    assert e.value.code == 2
