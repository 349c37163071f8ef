"""benchmarks/gpu_summary.py: the GPU check's table from recorded logs (fixtures/gpu_check: the
outputs of a `gpu_check.sh --cpu` run on this project's CPU machine, the long ones trimmed) and
from a run folder's results.db; its argument handling."""
from __future__ import annotations

import importlib.util
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from speechperf.results.schema import ALL

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures" / "gpu_check"
spec = importlib.util.spec_from_file_location("gpu_summary", ROOT / "benchmarks" / "gpu_summary.py")
gs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gs)


def test_status_reads_the_exit_line_timeouts_and_skips():
    assert gs.status("...\nexit 0 after 24s (timeout 30s)\n") == "ok, 24 s"
    assert gs.status("exit 124 after 300s (timeout 300s)") == "timed out, 300 s"
    assert gs.status("exit 1 after 3s (timeout 60s)") == "exit 1, 3 s"
    assert gs.status("skipped: budget spent") == "skipped (budget)"
    assert gs.status(None) == "missing"
    assert gs.status("a log cut before its end") == "no exit line"


def test_floor_and_pytest_lines():
    text = (FIXTURES / "logs" / "floor_doubled.log").read_text()
    got = gs.floor_figures(text)
    assert got.startswith("floor ") and "loop/floor" in got and "; batch 4 (bucket)" in got
    assert gs.floor_figures("Traceback ...") == "no floor table"
    assert gs.pytest_figures("x\n= 3 passed, 1 failed in 12.0s =\nexit 1 after 13s") == "3 passed, 1 failed in 12.0s"


def test_feed_row_says_whether_the_appetite_was_recorded():
    rows = [{"appetite audio s/s": 13800.0, "appetite spread %": None, "supply audio s/s per reader": 11436.8,
             "readers per GPU": 2, "host cores": 16, "GPUs this host feeds": 5.33,
             "appetite source": "appetite from recorded profile h100-2026-11-25 (...)"}]
    assert gs.feed_figures(rows) == ("appetite 13,800 audio s/s (recorded, spread NA %), supply 11,437 per reader: "
                                     "2 readers per GPU; 16 cores feed 5.33 GPUs")
    assert gs.feed_figures(None) == "no output"


def test_run_figures_from_a_results_db(tmp_path):
    con = sqlite3.connect(tmp_path / "results.db")
    con.executescript(ALL)
    con.executemany("INSERT INTO iterations (run_id, iteration, epoch, clock_s, batch_size, step_s) VALUES "
                    "('r', ?, 1, ?, ?, ?)", [(1, 10.0, 100, 0.1), (2, 40.0, 300, 0.3)])
    con.execute("INSERT INTO evals (run_id, epoch, split, decoder, beam, eval_s, final) VALUES ('r', 1, 'd', 'g', 1, 8.0, 0)")
    con.execute("INSERT INTO evals (run_id, epoch, split, decoder, beam, eval_s, final) VALUES ('r', 1, 'd', 'g', 1, 99.0, 1)")
    con.executemany("INSERT INTO samples (run_id, t, source, metric, value) VALUES ('r', ?, 'gpu0', 'util_pct', ?)", [(0.0, 50.0), (1.0, 70.0)])
    con.commit()
    con.close()
    assert gs.run_figures(tmp_path) == ("2 steps of 200 utt, 0.2 s/step; per-epoch evaluation 8 s of the 40 s clock "
                                        "(20 %); GPU busy 60 % over 2 NVML samples")
    assert gs.run_figures(tmp_path / "none") == f"no {tmp_path / 'none' / 'results.db'}"


def test_the_table_from_recorded_logs(tmp_path, capsys):
    out = tmp_path / "summary.md"
    assert gs.main([str(FIXTURES / "logs"), "--out", str(out), "--budget", "900", "--elapsed", "612"]) == 0
    text = out.read_text()
    assert capsys.readouterr().out == text
    head, _, header, _, *body = text.splitlines()
    assert head.startswith("# GPU check: None on AMD EPYC") and "commit 5d22bf1+dirty, 2026-11-26 06:05:12 UTC" in head and "612 s of a 900 s budget" in head
    assert header == "| step | status | figures |"
    steps = {line.split(" | ")[0].lstrip("| "): line for line in body}
    # every step but those of the GPU flow only; a step without a log reads "missing"
    assert list(steps) == [s for s in gs.STEPS if s not in ("feed_gpu", "feed_conformer", "floor_conformer_compile")]
    assert "| floor_conformer | missing | no output |" in text
    assert "| tests_cuda | exit 5, 48 s | 7 deselected in 14.96s |" in text
    assert "| demo | timed out, 300 s | no --runs |" in text
    assert "MFU" in steps["demo_tta"] and "never reached" in steps["demo_tta"]
    assert "(measured, spread" in steps["feed_tiny"]
    assert "features_sha256 " in steps["checksum"]


def test_a_missing_folder_is_refused(tmp_path, capsys):
    assert gs.main([str(tmp_path / "nowhere")]) == 2
    assert "nowhere is not a folder of logs" in capsys.readouterr().err
