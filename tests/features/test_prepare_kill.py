"""``prepare`` killed with SIGKILL after k shards, with 2 workers, then run again: every shard
once, byte for byte an uninterrupted run's, index.json and stats.json identical; the killed
run's workers die with it; index.json is exactly ``json.dumps(index, indent=1)`` although it
is written one shard at a time."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from speechperf.features.prepare import prepare
from tests.conftest import prepared_files


def _kill_after(cmd, out, shards: int) -> list[psutil.Process]:
    """Start ``cmd``, SIGKILL it once ``out`` holds ``shards`` finished shards (sidecars, all
    splits); returns the workers it had then."""
    p = psutil.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, workers = time.time() + 180, []
    while time.time() < deadline and p.poll() is None:
        try:
            workers = p.children(recursive=True) or workers
        except psutil.Error:
            pass
        if len(list(out.glob("*/shard-*.json"))) >= shards:
            break
        time.sleep(0.005)
    assert p.poll() is None, "prepare finished before it could be killed"
    p.send_signal(signal.SIGKILL)
    p.wait()
    return workers


@pytest.mark.timeout(600)
def test_sigkill_after_k_shards_with_two_workers_then_rerun_is_byte_identical(tiny_corpus, tiny_features, tmp_path):
    out = tmp_path / "feats"
    cmd = [sys.executable, "-m", "speechperf", "prepare", str(tiny_corpus), str(out), "--workers", "2", "--json"]
    total = len(list(tiny_features.glob("*/shard-*.json")))
    assert total >= 4
    for k in (1, total - 1):  # in the first split, then in a later one with one shard left
        workers = _kill_after(cmd, out, k)
        assert workers, "the pool never started"
        gone, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, f"workers outlived the SIGKILLed prepare: {[w.pid for w in alive]}"
        assert len(list(out.glob("*/shard-*.json"))) >= k
    assert not (out / "stats.json").exists()
    stale = out / "train-other" / ".shard-00000.npz.x.tmp"  # as a kill inside atomic_write leaves (unfinished split)
    stale.parent.mkdir(exist_ok=True)
    stale.write_bytes(b"half")
    kept = {p: p.stat().st_mtime_ns for p in out.glob("*/shard-*")}
    prepare(tiny_corpus, out, workers=2, progress=False)
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # finished shards were kept, not written again
    want, got = prepared_files(tiny_features), prepared_files(out)
    assert sorted(got) == sorted(want)  # every shard once, nothing else (no temporary left)
    # shards, sidecars, every index.json and stats.json byte for byte (prepare.json records the seconds taken)
    assert [k for k in want if got[k] != want[k] and k.name != "prepare.json"] == []
    assert (out / "stats.json").read_bytes() == (tiny_features / "stats.json").read_bytes()


def test_index_json_is_json_dumps_indent_1(tiny_features):
    for index in tiny_features.glob("*/index.json"):
        text = index.read_text()
        assert text == json.dumps(json.loads(text), indent=1), index


def test_a_worker_is_killed_with_its_parent():
    """The pool initializer's PR_SET_PDEATHSIG, in a process of its own (Linux only)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    code = ("import os, subprocess, sys, time\n"
            "from multiprocessing import get_context\n"
            "from speechperf.features.prepare import _worker_init\n"
            "pool = get_context('spawn').Pool(1, initializer=_worker_init, initargs=(os.getpid(),))\n"
            "print(pool.apply(os.getpid), flush=True)\n"
            "time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    worker = psutil.Process(int(p.stdout.readline()))
    p.kill()
    p.wait()
    worker.wait(timeout=10)  # psutil.TimeoutExpired: the orphan lived on
