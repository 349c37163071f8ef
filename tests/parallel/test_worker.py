"""The torchrun worker and the sweep on the tiny corpus; a dead worker; bad requests."""
import threading
import time

import psutil
import pytest

from speechperf.errors import SpeechperfError
from speechperf.parallel import sweep


def test_small_sweep_end_to_end(tiny_features, tmp_path):
    rows = sweep.run_sweep(["--data", str(tiny_features), "--out", str(tmp_path / "sw"), "--algos", "sync,bmuf,easgd",
                            "--workers", "2", "--sync-periods", "2", "--batch-sizes", "4", "--epochs", "1",
                            "--hidden", "32"])
    by = {(r["algo"], r["workers"]): r for r in rows}
    assert {("single", 1), ("sync", 2), ("bmuf", 2), ("easgd", 2)} <= set(by)
    for key in (("sync", 2), ("bmuf", 2), ("easgd", 2)):
        r = by[key]
        assert r["speedup (2 CPU cores)"] > 0 and r["cv_loss"] > 0 and r["WER test-clean"] is not None
    assert by[("bmuf", 2)]["MB/sync"] > 0 and by[("bmuf", 2)]["comm s/sync"] > 0
    assert (tmp_path / "sw" / "init.pt").exists()


def test_more_workers_than_shards_is_refused(tiny_features, tmp_path):
    with pytest.raises(SpeechperfError, match="shards"):
        sweep._launch(["--data", str(tiny_features), "--hidden", "8", "--epochs", "1"], "bsp", 12, [],
                      tmp_path / "many")


def test_a_dead_worker_stops_the_run_naming_its_rank(tiny_features, tmp_path):
    errors = []

    def run():
        try:
            sweep._launch(["--data", str(tiny_features), "--hidden", "32", "--epochs", "50"], "bsp", 2,
                          ["--sync-period", "1"], tmp_path / "dead")
        except SpeechperfError as e:
            errors.append(str(e))

    t = threading.Thread(target=run)
    t.start()
    victim, deadline = None, time.time() + 120
    while victim is None and time.time() < deadline:
        for p in psutil.Process().children(recursive=True):
            try:
                if p.environ().get("RANK") == "1" and "speechperf.parallel" in " ".join(p.cmdline()):
                    victim = p
            except psutil.Error:
                pass
        time.sleep(0.2)
    assert victim is not None, "rank 1 never started"
    time.sleep(3)  # let it get into training
    victim.kill()
    t.join(timeout=180)
    assert errors and "rank 1" in errors[0], errors
