"""A checkpoint is data, never code: a run folder copied from another machine may hold a
crafted ``checkpoint.pt``, and every command that reads one (eval, beam-sweep, train's
resume) refuses it by name without running anything inside; the RNG states round-trip
exactly through tensors and plain values."""
import pickletools
import random
import shutil
import zipfile

import numpy as np
import pytest
import torch

from speechperf.results.checkpoint import FORMAT, CheckpointError, contents, load, rng_state, set_rng_state
from tests.conftest import TINY_RUN, cli


class _WritesMarker:
    """Unpickling this runs ``open(marker, "w")``: what a crafted checkpoint would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _craft(path, marker):
    """A checkpoint of this format in every way but one value whose unpickling runs code."""
    torch.save({"format": FORMAT, "run_id": "x", "config": {}, "progress": {}, "payload": _WritesMarker(marker)},
               path)


def test_the_crafted_file_would_run_code_when_unpickled(tmp_path):
    """The test's own check: the crafted file does execute code under a plain load."""
    marker = tmp_path / "marker"
    _craft(tmp_path / "checkpoint.pt", marker)
    torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert marker.exists()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("command", ["eval", "beam-sweep", "train"])
def test_a_crafted_checkpoint_is_refused_by_name_and_nothing_in_it_runs(command, tiny_run, tiny_features, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    (run / "summary.json").unlink()  # unfinished: train continues it from the checkpoint
    marker = tmp_path / "marker"
    _craft(run / "checkpoint.pt", marker)
    args = {"eval": ["eval", run, "--decoder", "greedy"],
            "beam-sweep": ["beam-sweep", run, "--widths", "2", "--decoder", "beam"],
            "train": ["train", "--data", tiny_features, "--out", run, *TINY_RUN]}[command]
    p = cli(*args)
    assert p.returncode == 2, p.stderr
    assert str(run / "checkpoint.pt") in p.stderr and "not a speechperf checkpoint" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    assert not marker.exists()


def test_rng_states_as_numpy_and_python_objects_are_refused(tmp_path):
    """numpy's and python's RNG states as their own objects: loading them would run code."""
    torch.save({"format": FORMAT, "run_id": "x", "config": {}, "progress": {},
                "rng": {"numpy": np.random.get_state(), "python": random.getstate()}}, tmp_path / "checkpoint.pt")
    with pytest.raises(CheckpointError, match=r"checkpoint.pt cannot be read: not a speechperf checkpoint: it holds "
                                              r"objects other than tensors and plain values"):
        load(tmp_path)


@pytest.mark.parametrize("payload,why", [
    (b"not a checkpoint at all", "not a speechperf checkpoint"),
    ({"weights": torch.zeros(2)}, "not a speechperf checkpoint"),
    ([1, 2, 3], "not a speechperf checkpoint"),
    ({"format": FORMAT + 1}, f"format {FORMAT + 1}, not {FORMAT}: written by a newer release"),
])
def test_a_foreign_file_is_refused_by_name(tmp_path, payload, why):
    path = tmp_path / "checkpoint.pt"
    if isinstance(payload, bytes):
        path.write_bytes(payload)
    else:
        torch.save(payload, path)
    with pytest.raises(CheckpointError, match=why) as e:
        load(tmp_path)
    assert str(path) in str(e.value)


def test_the_checkpoint_holds_only_tensors_and_plain_values(tmp_path):
    """Everything :func:`contents` writes loads under ``weights_only=True``, and its pickle names
    no global outside torch's (numpy's array, python's Random state would need code)."""
    progress = {"epoch": 1, "evals": [(1.0, np.float64(2.0), np.float32(3.0))]}  # a numpy rate becomes a float
    torch.save(contents("r1", {"train": {"lr": 0.1}}, progress, {"model": {"w": torch.ones(3)}}), tmp_path / "checkpoint.pt")
    assert load(tmp_path)["progress"]["evals"] == [(1.0, 2.0, 3.0)]
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["format"] == FORMAT
    with zipfile.ZipFile(tmp_path / "checkpoint.pt") as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    names = {arg for op, arg, _ in pickletools.genops(pkl) if op.name == "GLOBAL"}
    assert names and all(n.startswith(("torch", "collections OrderedDict")) for n in names), names


def test_the_rng_states_round_trip_exactly_through_a_checkpoint(tmp_path):
    torch.manual_seed(3), np.random.seed(4), random.seed(5)
    np.random.standard_normal()  # numpy's cached gaussian is part of its state
    random.gauss(0, 1)  # python's too
    torch.save(contents("r1", {}, {}, {}), tmp_path / "checkpoint.pt")
    expected = (torch.rand(4), np.random.standard_normal(3), np.random.rand(2), random.random(), random.gauss(0, 1))
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    set_rng_state(load(tmp_path)["rng"])
    got = (torch.rand(4), np.random.standard_normal(3), np.random.rand(2), random.random(), random.gauss(0, 1))
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
    assert np.array_equal(got[2], expected[2]) and got[3:] == expected[3:]
    assert rng_state()["threads"] == torch.get_num_threads()

