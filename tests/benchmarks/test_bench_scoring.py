"""benchmarks/bench_scoring.py: its pairs have the CER asked for, its reference gives the same rates
as the evaluation's scoring, and a small real run prints the table."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from speechperf.scoring.error_rates import error_rates

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_scoring", ROOT / "benchmarks" / "bench_scoring.py")
bs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bs)


@pytest.mark.parametrize("cer", [5.0, 30.0])
def test_the_pairs_have_about_the_cer_asked_for(cer):
    refs, hyps = bs.pairs(400, cer)
    assert len(refs) == len(hyps) == 400 and all(h == " ".join(h.split()) for h in hyps)
    assert error_rates(refs, hyps).cer == pytest.approx(cer, rel=0.25)


def test_the_reference_gives_the_same_rates():
    refs, hyps = bs.pairs(200, 20.0)
    ref = bs.reference_score(refs, hyps)
    ours = bs.score(refs, hyps, intervals=False)
    assert all(ours[k] == pytest.approx(ref[k], rel=1e-12) for k in ("wer", "cer", "cer_paper"))


def test_a_small_run_prints_the_table(capsys):
    assert bs.main(["--utts", "60", "--cer", "10", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "60 pairs" in out and out.rstrip().endswith("x")
