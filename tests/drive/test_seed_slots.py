"""``train --seeds N --parallel K``: seeds side by side, one per device (drive/seed_slots.py)."""
import json
import os
import subprocess
import sys

import pytest

from speechperf.cli import main
from speechperf.config import ConfigError
from speechperf.errors import RunFailed
from speechperf.results import ResultsDB
from speechperf.train.request import TrainRequest
from speechperf.drive.seed_slots import slot_settings, train_seeds_parallel

LOSSES = "SELECT iteration, loss FROM iterations WHERE run_id = ? ORDER BY iteration"


def test_one_gpu_per_seed_from_the_visible_ones():
    slots = slot_settings(2, "tiny", [], cuda_devices=["3", "5", "6"])
    assert slots == [({"CUDA_VISIBLE_DEVICES": "3"}, []), ({"CUDA_VISIBLE_DEVICES": "5"}, [])]
    with pytest.raises(ConfigError, match="--parallel 4: 3 GPU"):
        slot_settings(4, "tiny", [], cuda_devices=["3", "5", "6"])
    with pytest.raises(ConfigError, match="train.system.device=cuda:1"):
        slot_settings(2, "tiny", ["train.system.device=cuda:1"], cuda_devices=["0", "1"])
    # train.system.device=cpu on a GPU machine: the CPUs are shared
    assert slot_settings(2, "tiny", ["train.system.device=cpu"], cuda_devices=["0", "1"], cores=8) == [({}, ["train.system.threads=4"])] * 2


def test_cpu_slots_share_the_cores():
    assert slot_settings(2, "tiny", [], cuda_devices=[], cores=5) == [({}, ["train.system.threads=2"])] * 2
    assert slot_settings(2, "tiny", ["threads=2"], cuda_devices=[], cores=4) == [({}, [])] * 2  # threads given: kept
    with pytest.raises(ConfigError, match="more than the 4 CPUs"):
        slot_settings(2, "tiny", ["threads=3"], cuda_devices=[], cores=4)
    with pytest.raises(ConfigError, match="only 2 CPUs"):
        slot_settings(3, "tiny", [], cuda_devices=[], cores=2)
    with pytest.raises(ConfigError, match="at least 1"):
        slot_settings(0, "tiny", [], cuda_devices=[], cores=2)
    with pytest.raises(ConfigError, match="nosuch"):  # a bad override is refused before any seed starts
        slot_settings(2, "tiny", ["train.nosuch=1"], cuda_devices=[], cores=2)


# a seed's process as a stand-in: seed 2 fails after a second; the others wait for SIGTERM and
# write down that it came (then exit as an interrupted run does)
FAKE = r"""
import signal, sys, time, pathlib
seed, out = int(sys.argv[1]), pathlib.Path(sys.argv[2])
def term(*_):
    (out / f"term-{seed}").write_text("asked")
    sys.exit(143)
signal.signal(signal.SIGTERM, term)
(out / f"started-{seed}").write_text("")
if seed == 2:
    time.sleep(1.0)
    print("seed 2: boom", file=sys.stderr)
    sys.exit(1)
time.sleep(60)
"""


def _fake(seed, request):
    return [sys.executable, "-c", FAKE, str(seed), str(request.out.parent)]


def test_a_failing_seed_stops_the_others_saved_and_names_itself(tmp_path):
    with pytest.raises(RunFailed) as e:
        train_seeds_parallel([1, 2, 3], 2, TrainRequest("tiny", out=tmp_path, overrides=["threads=1"]), command=_fake,
                             cuda_devices=[], cores=2)
    msg = "; ".join([str(e.value), *e.value.__notes__])
    assert "seed 2 exited 1" in msg and str(tmp_path / "seed-2") in msg and "seed 2: boom" in msg
    assert "seeds 1, 3 not finished" in msg  # 1 was stopped beside it, 3 never started
    assert (tmp_path / "term-1").read_text() == "asked"  # the seed beside it was asked to save and stop
    assert not (tmp_path / "started-3").exists()  # no new seed after a failure


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two seeds side by side need two CPUs")
@pytest.mark.timeout(600)
def test_two_seeds_side_by_side_train_as_one_after_another(tiny_features, tmp_path):
    args = ["train", "--data", tiny_features, "--seeds", "2", "--json", "--preset", "tiny", "threads=1", "max_epochs=1"]
    side, serial = tmp_path / "side", tmp_path / "serial"
    p = subprocess.run([sys.executable, "-m", "speechperf", *map(str, args), "--out", side, "--parallel", "2"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert [(s["seed"], s["status"]) for s in json.loads(p.stdout)] == [(1, "success"), (2, "success")]
    assert sorted(x.name for x in side.iterdir()) == ["seed-1", "seed-1.log", "seed-2", "seed-2.log"]
    assert main([*map(str, args), "--out", str(serial)]) == 0
    for seed in (1, 2):  # one thread each: the same run, bit for bit, side by side or one after another
        runs = [json.loads((top / f"seed-{seed}" / "run.json").read_text()) for top in (side, serial)]
        assert runs[0]["label"] == runs[1]["label"] and runs[0]["label"].endswith(f" seed {seed}")
        rows = []
        for top, info in zip((side, serial), runs):
            with ResultsDB(top / f"seed-{seed}" / "results.db", readonly=True) as db:
                rows.append(db.query(LOSSES, [info["run_id"]]))
        assert rows[0] == rows[1] and rows[0]


def test_parallel_without_seeds_is_refused(tmp_path, capsys):
    assert main(["train", "--out", str(tmp_path / "r"), "--parallel", "2"]) == 2
    assert "--parallel 2 without --seeds" in capsys.readouterr().err


PARENT = r"""
import sys, pathlib
sys.path.insert(0, sys.argv[2])
from test_seed_slots import _fake
from speechperf.drive import seed_slots
from speechperf.train.request import TrainRequest
from speechperf.errors import SpeechperfError
out = pathlib.Path(sys.argv[1])
try:
    seed_slots.train_seeds_parallel([1, 3], 2, TrainRequest("tiny", out=out, overrides=["threads=1"]), command=_fake,
                                    cuda_devices=[], cores=2)
except SpeechperfError as e:
    print("; ".join([str(e), *e.__notes__]), file=sys.stderr)
    sys.exit(e.exit_code)
"""


def test_sigterm_to_the_command_asks_every_seed_to_save_and_stop(tmp_path):
    import signal
    import time

    p = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path), os.path.dirname(__file__)],
                         stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not all((tmp_path / f"started-{s}").exists() for s in (1, 3)) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # each stand-in has its SIGTERM handler before it writes started-S; let it settle
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == 143
    err = p.stderr.read()
    assert "stopped by SIGTERM" in err and "seeds 1, 3 not finished" in err
    assert all((tmp_path / f"term-{s}").read_text() == "asked" for s in (1, 3))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two seeds side by side need two CPUs")
def test_a_diverged_seed_is_named_with_its_status(tiny_features, tmp_path):
    p = subprocess.run([sys.executable, "-m", "speechperf", "train", "--data", str(tiny_features), "--out",
                        str(tmp_path / "out"), "--seeds", "2", "--parallel", "2", "--preset", "tiny", "threads=1",
                        "max_epochs=1", "lr=1e30"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1
    assert "its run's status 'diverged: " in p.stderr and str(tmp_path / "out" / "seed-") in p.stderr, p.stderr


# a seed's process as a stand-in that writes down how many seeds it was told started beside it, then
# ends: seed 1 fails once seed 2 has written (the command stops there)
TOLD = r"""
import os, sys, time, pathlib
seed, out = int(sys.argv[1]), pathlib.Path(sys.argv[2])
(out / f"told-{seed}").write_text(os.environ.get("SPEECHPERF_RESIDENT_SIDE_BY_SIDE", "none"))
waited = time.time() + 20
while seed == 1 and not (out / "told-2").exists() and time.time() < waited:
    time.sleep(0.01)
sys.exit(1 if seed == 1 else 0)
"""


def test_cpu_seeds_started_together_are_told_how_many_fill_a_buffer(tmp_path):
    """Issue 61: loader.resident's check counts the seeds started beside it (data/resident.py)."""
    from speechperf.data.loader_config import SIDE_BY_SIDE

    assert SIDE_BY_SIDE == "SPEECHPERF_RESIDENT_SIDE_BY_SIDE"
    told = lambda seed, request: [sys.executable, "-c", TOLD, str(seed), str(request.out.parent)]  # noqa: E731
    with pytest.raises(RunFailed):
        train_seeds_parallel([1, 2], 2, TrainRequest("tiny", out=tmp_path, overrides=["threads=1"]), command=told,
                             cuda_devices=[], cores=2)
    assert [(tmp_path / f"told-{s}").read_text() for s in (1, 2)] == ["2", "2"]
