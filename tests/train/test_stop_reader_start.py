"""Issue 61: SIGTERM sent to a run's whole process group (Slurm's scancel, Kubernetes) while the readers
of the next epoch (started as epoch 1's evaluation begins) or of the final evaluation are starting
(epoch 1's own evaluation reads batches kept in memory), at the moment the loader's readers were unprotected (tests/train/stop_child.py sends it
from inside the reader, after torch's worker set its own handlers): the run stops as any stop does,
exit 143 within seconds, recorded as interrupted in its database, summary and events.log, a
checkpoint saved, no reader left; never "DataLoader worker (pid N) is killed by signal: Terminated"."""
import json
import os
import time

import pytest

from speechperf.results import ResultsDB
from speechperf.results.events import read_events
from tests.conftest import cli_start

ARGS = ["--preset", "tiny", "threads=1", "max_epochs=2", "checkpoint_every=100", "sentence_every=50", "readers=1",
        "train.eval.decoder=greedy"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("phase", ["ahead-readers", "final-readers"])
def test_a_group_sigterm_as_readers_start_is_a_recorded_stop(tiny_features, tmp_path, phase):
    run, marker, left = tmp_path / "run", tmp_path / "signalled", tmp_path / "left"
    p = cli_start(phase, marker, left, "train", "--json", "--data", tiny_features, "--out", run, *ARGS, session=True,
                  module="tests.train.stop_child")
    rc = p.wait(timeout=240)
    ended, err = time.time(), p.stderr.read()
    assert marker.exists(), f"no reader of that phase started: {err}"
    assert rc == 143, err
    assert ended - float(marker.read_text()) < 10, "the stopped process took too long to end"
    assert "interrupted (SIGTERM)" in err and "Traceback" not in err and "DataLoader worker" not in err
    assert json.loads(left.read_text()) == []
    with pytest.raises(ProcessLookupError):
        os.killpg(p.pid, 0)
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    with ResultsDB(run / "results.db") as db:
        assert db.query("SELECT status FROM runs WHERE run_id = ?", [run_id]) == [
            {"status": "failed: interrupted (SIGTERM)"}]
    assert json.loads((run / "summary.json").read_text())["status"] == "failed: interrupted (SIGTERM)"
    stops = [e["metadata"]["status"] for e in read_events(run / "events.log") if e["key"] == "run_stop"]
    assert stops == ["aborted"]
    assert (run / "checkpoint.pt").exists()
