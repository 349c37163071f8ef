"""benchmarks/gpu_summary.py: the GPU check's table from recorded logs (fixtures/gpu_check: the
outputs of a `gpu_check.sh --cpu` run on this project's CPU machine, the long ones trimmed) and
from a run folder's results.db; its argument handling."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from speechperf.results.run import Run

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
    now = text.replace("batch 4 (bucket)", "batch 130 utt (bucket, max_duration 720 s)")  # the header's form now
    assert gs.floor_figures(now).endswith("; batch 130 utt (bucket, max_duration 720 s)")
    assert gs.floor_figures("Traceback ...") == "no floor table"
    assert gs.pytest_figures("x\n= 3 passed, 1 failed in 12.0s =\nexit 1 after 13s") == "3 passed, 1 failed in 12.0s"


def test_the_profile_row_per_preset_and_phase():
    """bench_step_profile.py's phase table as speechperf.tables prints it on a GPU (two presets, the
    second cut before its table) and on this CPU (the recorded log of a `gpu_check.sh --cpu` run)."""
    from speechperf.tables import format_table

    cols = ["phase", "unprofiled ms", "profiled ms", "host ops ms", "sync wait ms", "kernel ms", "busy %", "kernels",
            "launches", "syncs", "top sync site"]
    rows = [["train step", 97.1, 120.4, 80.2, 5.1, 44.6, 45.9, 1234.0, 1250.0, 6.0,
             "aten::ctc_loss > aten::copy_ (cudaStreamSynchronize)"],
            ["evaluation", 1300.0, 1650.0, 1100.0, 20.0, 351.0, 27.0, 5000.0, 5100.0, 42.0,
             "aten::item (cudaStreamSynchronize)"]]
    table = format_table([dict(zip(cols, r)) for r in rows], cols)
    text = ("== preset gpu: cuda:0 (NVIDIA H200), bf16, ...\n" + table
            + "\nprofiled / unprofiled wall: train step 1.24\n-- train step: host syncs by site (per step)\n"
            "== preset conformer: cuda:0 (NVIDIA H200), bf16, ...\nexit 124 after 45s (timeout 45s)\n")
    assert gs.profile_figures(text) == (  # the numbers as the table prints them (4 significant digits)
        "gpu: train step: 6 syncs a step (top aten::ctc_loss > aten::copy_ (cudaStreamSynchronize)), GPU busy "
        "45.9 %, 1234 kernels; 97.1 ms a step (120.4 profiled, 80.2 of it in host aten ops); evaluation: 42 syncs a "
        "pass (top aten::item (cudaStreamSynchronize)), GPU busy 27 %, 5000 kernels; 1300 ms a pass (1650 profiled, "
        "1100 of it in host aten ops)")
    cpu = gs.profile_figures((FIXTURES / "logs" / "profile.log").read_text())
    assert cpu.startswith("tiny: train step: ")
    assert " of it in host aten ops) (device columns n/a); evaluation: " in cpu
    assert gs.profile_figures("Traceback ...") == "no profile table"


def test_a_compile_cut_by_its_timeout_says_so():
    assert gs.compile_figures("...\nexit 124 after 96s (timeout 96s)\n") == "compile did not finish in 96 s"
    assert gs.compile_figures((FIXTURES / "logs" / "floor.log").read_text()).startswith("floor ")


def test_feed_row_says_whether_the_appetite_was_recorded():
    rows = [{"appetite audio s/s": 13800.0, "appetite spread %": None, "supply audio s/s per reader": 11436.8,
             "readers per GPU": 2, "host cores": 16, "GPUs this host feeds": 5.33,
             "appetite source": "appetite from recorded profile h100-2026-11-25 (...)"}]
    assert gs.feed_figures(rows) == ("appetite 13,800 audio s/s (recorded, spread NA %), supply 11,437 per reader: "
                                     "2 readers per GPU; 16 cores feed 5.33 GPUs")
    assert gs.feed_figures(None) == "no output"


H100 = {"device": "cuda:0", "world_size": 1, "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}]}


def _run(root, env, summary):
    """A run stopped after two epochs of two steps each: steps of 1 s (100 and 300 utterances, 5e14
    training FLOPs each), epoch 1's [0, 2] and its evaluation [2, 3], epoch 2's [3, 5] and its
    evaluation [5, 6]; CER 12 then 11 (no TTA)."""
    with Run.create(root, kind="train", config={"preset": "gpu", "train": {"system": {"precision": "bf16"}}}, env=env,
                    label="r") as run:
        for n, (epoch, clock, utts) in enumerate(((1, 1.0, 100), (1, 2.0, 300), (2, 4.0, 100), (2, 5.0, 300))):
            run.rows.add_iteration({"iteration": n, "epoch": epoch, "clock_s": clock, "batch_size": utts, "step_s": 1.0,
                               "model_flops": 5e14, "data_s": 0.0, "ckpt_s": 0.0})
        run.rows.flush()
        run.rows.insert("evals", [{"run_id": run.run_id, "epoch": e, "split": "dev-clean", "decoder": "greedy", "beam": 1,
                              "clock_s": 3.0 * e, "eval_s": 1.0, "cer": 13.0 - e, "n_utts": 10, "final": 0}
                             for e in (1, 2)])
        # NVML utilization: 90% and 70% in the training phases, 10% in the evaluations, one sample after them
        run.rows.insert("samples", [{"run_id": run.run_id, "t": t, "source": "gpu0", "metric": "util_pct", "value": v,
                                "segment": 1.0} for t, v in ((1.0, 90.0), (2.5, 10.0), (4.0, 70.0), (5.5, 10.0),
                                                             (7.0, 100.0))])
        run.rows.set_status("failed: interrupted (SIGTERM)")
        run.write_summary(summary)
    return root


def test_run_figures_of_a_run_cut_before_its_summary_held_an_mfu(tmp_path):
    run = _run(tmp_path / "cut", H100, {"status": "failed: interrupted (SIGTERM)"})
    peak = ("NVIDIA H100 Tensor Core GPU datasheet (2023), dense bf16; platform profile h100-sxm "
            "(looked up for the recorded GPU: the run recorded no peak)")
    assert gs.run_figures(run) == (
        "4 steps of 200 utt, 1 s/step; per-epoch evaluation 2 s of the 5 s clock (40 %); GPU busy 45 % to the last "
        "evaluation (target not reached) (4 samples), 80 % in training (2), 10 % in evaluations (2); "
        f"step MFU 50.5 % (500 TFLOPS of 989.5; {peak})")
    # a finished run's summary holds its peak: that one is used; a CPU run cut before it has none
    finished = _run(tmp_path / "done", H100, {"status": "success", "peak_tflops": 1000.0, "peak_source": "a sheet"})
    assert gs.run_figures(finished).endswith("step MFU 50 % (500 TFLOPS of 1,000; a sheet)")
    cpu = _run(tmp_path / "cpu", {"device": "cpu"}, {"status": "failed: interrupted (SIGTERM)"})
    assert gs.run_figures(cpu).endswith("busy: no CPU utilization samples; step MFU NA % (500 TFLOPS of NA; the run "
                                        "recorded no peak (a CPU's is measured at a run's initialization))")
    assert gs.run_figures(tmp_path / "none") == f"no {tmp_path / 'none' / 'results.db'}"
    (cpu / "run.json").unlink()  # cut while its folder was made
    assert gs.run_figures(cpu).startswith("unreadable run: ")


def test_a_run_says_which_gpus_it_sampled(tmp_path):
    picked = _run(tmp_path / "one", H100, {"status": "success", "sampled_gpus": {"sources": ["gpu5"], "selection": None}})
    assert "; sampled gpu5" in gs.run_figures(picked)
    every = _run(tmp_path / "all", H100, {"status": "success", "sampled_gpus": {
        "sources": ["gpu0", "gpu1"], "selection": "every GPU sampled: NVML gave no UUID (X)"}})
    assert "; sampled gpu0, gpu1 (every GPU sampled: NVML gave no UUID (X))" in gs.run_figures(every)


def test_a_run_trained_from_cuda_graphs_says_its_captures(tmp_path):
    graphs = {"shapes": 26, "eval shapes": 4, "capture s": 9.5, "eager steps": 1, "grid": [8, 16]}
    run = _run(tmp_path / "g", H100, {"status": "success", "peak_tflops": 1000.0, "peak_source": "a sheet",
                                       "cuda_graphs": graphs})
    assert "; CUDA graphs: 26 shapes captured (4 evaluation shapes) in 9.5 s, 1 steps of unplanned shapes run eagerly" in gs.run_figures(run)


def test_run_figures_of_the_recorded_h200_runs():
    """The demo (CER 10 in 1.93 min) and the 55 s conformer run of one H200 check (commit 9e0dabc's tree),
    their records trimmed to the rows read here."""
    demo = gs.run_figures(FIXTURES / "runs" / "demo" / "run")
    assert demo == ("672 steps of 170 utt, 0.129 s/step; per-epoch evaluation 23.4 s of the 114 s clock (20 %); "
                    "GPU busy 37 % of the TTA (581 samples), 44 % in training (439), 19 % in evaluations (118); "
                    "step MFU 3.92 % (38.8 TFLOPS of 989.5; NVIDIA H200 Tensor Core GPU datasheet (2024), dense "
                    "bf16; platform profile h200)")
    conformer = gs.run_figures(FIXTURES / "runs" / "conformer")  # killed at 55 s: its summary has no MFU
    assert conformer.startswith("81 steps of 352 utt, 0.458 s/step; ")
    assert ("GPU busy 31 % to the last evaluation (target not reached) (210 samples), 32 % in training (187), "
            "31 % in evaluations (19); step MFU 0.855 % (8.46 TFLOPS of 989.5; ") in conformer
    assert conformer.endswith("platform profile h200 (looked up for the recorded GPU: the run recorded no peak))")


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
    assert list(steps) == [s for s in gs.STEPS if s not in ("feed_gpu", "feed_conformer", "floor_conformer_compile",
                                                           "graphs", "graphs_tta")]
    assert steps["profile"].startswith("| profile | ok, ") and "tiny: train step: " in steps["profile"]
    assert "| floor_conformer | missing | no output |" in text
    assert "| tests_cuda | exit 5, 48 s | 7 deselected in 14.96s |" in text
    assert "| demo | timed out, 300 s | no --runs |" in text
    assert "MFU" in steps["demo_tta"] and "never reached" in steps["demo_tta"]
    assert "(measured, spread" in steps["feed_tiny"]
    assert "features_sha256 " in steps["checksum"]
    assert "loop/floor" in steps["floor"] and "loop/floor" in steps["floor_doubled"]
    assert "| floor_graphs | missing | no output |" in text
    assert steps["scale"].startswith("| scale | ok, 3 s | fastconformer-l fp32 x1, 20 s batches: 377 audio s/s, ")
    assert "GPU busy NA %, peak 0.0096 GB (estimate 0.00911 GB, estimate/peak 0.949) |" in steps["scale"]
    assert list(steps).index("tests_gpu_files") == list(steps).index("feed_tiny") + 1
    assert not {"attention", "lstm", "eval_sync", "checkpoint", "masked_step", "epoch_start"} & set(steps)  # retired


def test_a_missing_folder_is_refused(tmp_path, capsys):
    assert gs.main([str(tmp_path / "nowhere")]) == 2
    assert "nowhere is not a folder of logs" in capsys.readouterr().err


def test_the_table_reads_the_runs_given(capsys):
    assert gs.main([str(FIXTURES / "logs"), "--runs", str(FIXTURES / "runs")]) == 0
    steps = {line.split(" | ")[0].lstrip("| "): line for line in capsys.readouterr().out.splitlines()[4:]}
    assert "GPU busy 37 % of the TTA (581 samples), 44 % in training (439)" in steps["demo"]
    assert "step MFU 0.855 % (8.46 TFLOPS of 989.5; " in steps["conformer"]


def test_the_autocast_probe_joins_the_head():
    text = ("torch 2.11.0+cu130 cuda 13.0 cudnn 91900 gpu NVIDIA H200 python 3.12.3\n"
            "autocast bf16: lstm out torch.float16 linear out torch.bfloat16 lstm weight grad torch.float32\n")
    env = gs.env_figures(text)
    assert env["device"] == "NVIDIA H200"
    assert env["autocast"] == "lstm out torch.float16 linear out torch.bfloat16 lstm weight grad torch.float32"
    assert gs.env_figures("torch 2.11.0 cuda 13.0 cudnn 1 gpu X python 3")["autocast"] is None


def test_a_run_s_decodes_read_as_threads_rate_and_core_share():
    assert gs.decode_figures({"threads": 8, "frames per thread-s": 12345.6, "core share %": 41.26}) == \
        "decode 8 threads, 12,346 frames/s per thread-second, 41.3 % of a core each"


def test_the_fp8_row_reads_the_benchmarks_medians_and_ratio():
    text = ("fastconformer-l: fastconformer d_model 512 x 2 layers, batch 10 x 600 frames, cpu, torch 2.13.0+cpu, 2 "
            "threads, compile False; fp8: emulated (...)\n"
            "  bf16: median step 10.453 s (min 9.015, max 12.420), 0.96 utterances/s\n"
            "  fp8: median step 23.580 s (min 19.341, max 47.103), 0.42 utterances/s\n"
            "fp8/bf16 throughput: 0.443 (17 of 18 Linear layers in float8, the others in bf16 (head: out_features 1025 "
            "not a multiple of 16)); emulated: what torchao's emulation costs here, not a measure of fp8\n"
            "exit 0 after 301s (timeout 90s)\n")
    assert gs.fp8_figures(text) == ("bf16 10.453 s/step, fp8 23.580 s/step: fp8/bf16 throughput 0.443 (emulated: what "
                                    "torchao's emulation costs here, not a measure of fp8)")
    assert gs.fp8_figures("fp8 does not run here: unsupported on this GPU: no FP8 tensor cores\nexit 0") == (
        "not run: unsupported on this GPU: no FP8 tensor cores")
    assert gs.fp8_figures(None) == "no fp8 figures"


def test_the_scale_row_reads_each_workloads_rate_mfu_busy_and_memory():
    ok = {"workload": "parakeet-rnnt-sizes", "precision": "bf16", "world": 1, "batch_s": 600.0, "status": "ok",
          "audio_s_per_s": 2345.6, "step_s": 0.25, "mfu_pct": 47.3, "gpu_busy_pct": 96.0, "peak_gb": 61.2,
          "estimate_gb": 58.0, "estimate_ratio": 0.948}
    unfit = {**ok, "workload": "fastconformer-xl", "status": "does not fit: fastconformer-xl at 1000 s: 90 GB"}
    assert gs.scale_figures([ok, unfit]) == (
        "parakeet-rnnt-sizes bf16 x1, 600 s batches: 2,346 audio s/s, 0.25 s/step, MFU 47.3 %, GPU busy 96 %, peak "
        "61.2 GB (estimate 58 GB, estimate/peak 0.948) // fastconformer-xl bf16 x1, 600 s batches: does not fit: "
        "fastconformer-xl at 1000 s: 90 GB")
    assert gs.scale_figures(None) == gs.scale_figures([]) == "no output"


def test_every_step_the_check_runs_has_a_row():
    import re

    script = (ROOT / "benchmarks" / "gpu_check.sh").read_text()
    named = set(re.findall(r"^\s*(?:\[.*?\] && )?step (\w+) ", script, re.M))  # feed_$p: STEPS names each preset's
    assert {"env", "demo", "scale", "fp8", "floor_conformer_compile"} <= named
    assert named - {"env"} <= set(gs.STEPS)
