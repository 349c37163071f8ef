"""The run folder's owners: a view reads and never writes; a writer's rows wait for ``flush``;
a resumed writer cuts the rows and logs written after its checkpoint, byte for byte."""
import os

from speechperf.results import upgrade
from speechperf.results.layout import EVENTS_FILE, SENTENCES_FILE
from speechperf.results.progress import Progress
from speechperf.results.run import Run
from speechperf.results.view import RunView

CONFIG = {"preset": "tiny", "train": {"precision": "fp32", "seed": 1, "eval_split": "dev-clean"}}
ENV = {"cpu_model": "Test CPU", "cpu_cores_logical": 2, "device": "cpu"}


def _iteration(n: int) -> dict:
    return {"iteration": n, "epoch": 1, "clock_s": float(n), "loss": 1.0, "batch_size": 4, "frames": 10,
            "audio_s": 1.0, "step_s": 0.1, "utts_per_s": 40.0, "audio_s_per_s": 10.0}


def _state(folder) -> dict:
    """Every file's size and modification time, but SQLite's shared-memory files (a reader's)."""
    return {f: (os.stat(folder / f).st_size, os.stat(folder / f).st_mtime_ns) for f in os.listdir(folder)
            if not f.startswith("results.db-")}


def _recorded(folder):
    with Run.create(folder, kind="train", config=CONFIG, env=ENV, label="probe") as run:
        for n in range(1, 4):
            run.rows.add_iteration(_iteration(n))
        run.rows.insert("evals", [{"run_id": run.run_id, "epoch": 1, "split": "dev-clean", "decoder": "greedy",
                                   "beam": 1, "clock_s": 3.0, "eval_s": 1.0, "loss": 2.0, "n_utts": 4, "final": 0}])
        run.log.append_sentences({"iteration": 3, "epoch": 1, "loss": 1.0, "pairs": [{"ref": "a", "hyp": "b"}]})
        run.log.events().event("probe", 1)
        run.rows.set_status("success")
        run.write_summary({"status": "success", "init_s": 1.0})
    return folder


def test_a_view_reads_everything_and_writes_nothing(tmp_path):
    folder = _recorded(tmp_path / "run")
    before = _state(folder)
    with RunView.open(folder) as view:
        assert view.label == "probe" and view.env == ENV and view.finished
        assert view.config == upgrade.config(CONFIG)  # the fields recorded since filled in (results/upgrade.py)
        assert [r["iteration"] for r in view.rows.iterations()] == [1, 2, 3]  # close flushed the pending rows
        assert [e["epoch"] for e in view.rows.evals()] == [1] and view.rows.samples() == []
        assert view.rows.row()["status"] == "success" and view.rows.beam_sweep() == []
        assert view.log.sentences()[0]["pairs"] == [{"ref": "a", "hyp": "b"}]
        assert set(view.log.log_sizes()) == {EVENTS_FILE, SENTENCES_FILE}
        assert not hasattr(view.rows, "add_iteration") and not hasattr(view.log, "events")
    assert _state(folder) == before


def test_iteration_rows_wait_for_flush(tmp_path):
    with Run.create(tmp_path / "run", kind="train", config=CONFIG, env=ENV) as run:
        run.rows.add_iteration(_iteration(1))
        assert run.rows.iterations() == []  # buffered until the checkpoint's flush
        run.rows.flush()
        assert [r["run_id"] for r in run.rows.iterations()] == [run.run_id]


def test_a_resumed_writer_cuts_what_came_after_its_checkpoint(tmp_path):
    folder = _recorded(tmp_path / "run")
    sizes = RunView.open(folder).log.log_sizes()
    kept = {name: (folder / name).read_bytes() for name in sizes}
    with Run.open(folder) as run:  # what a process writes after its checkpoint, then is killed
        for n in range(4, 7):
            run.rows.add_iteration(_iteration(n))
        run.log.append_sentences({"iteration": 6, "epoch": 2, "loss": 0.5, "pairs": []})
        run.log.events().event("after", 2)
    progress = Progress(epoch=2, iteration=3, clock_s=3.0, log_sizes=sizes)
    run = Run.open(folder, data=tmp_path)  # as train/admission.py's Admission.begin continues a run
    run.continue_from(progress)
    run.close()
    with RunView.open(folder) as view:
        assert [r["iteration"] for r in view.rows.iterations()] == [1, 2, 3]
        assert view.rows.row()["status"] == "running" and [e["epoch"] for e in view.rows.evals()] == [1]
    assert {name: (folder / name).read_bytes() for name in sizes} == kept
