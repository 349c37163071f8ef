"""benchmarks/bench_ctc.py: the CTC loss by speechperf's kernel against torch's, alone and in the step, through
the suite's runner."""
import json

from tests.conftest import run_benchmark


def test_a_run_times_both_kernels_alone_and_in_the_step(tmp_path, capsys):
    ledger = tmp_path / "ledger.jsonl"
    assert run_benchmark("ctc", "--ledger", ledger, "--preset", "tiny", "--rounds", "1", "--threads", "1") == 0
    out = capsys.readouterr().out
    assert "tiny fp32: batch " in out and "loss forward+backward: torch " in out and "training step: torch's CTC" in out
    figures = json.loads(ledger.read_text().splitlines()[-1])["figures"]
    loss = figures["fp32"]["fwd_bwd_s"]
    assert figures["ratio"] == loss["torch"] / loss["numba"] and set(figures["fp32"]["step_s"]) == {"torch", "numba"}
