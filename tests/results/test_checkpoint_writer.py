"""A checkpoint written on a background thread: the same file as a synchronous save, a write
error raised at the next wait naming the file, a kill during the write leaving the previous
checkpoint whole."""
import errno
import threading
import time
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from speechperf.atomic import DiskFullError, atomic_torch_save
from speechperf.results import checkpoint
from speechperf.results.checkpoint_writer import CheckpointWriteError, CheckpointWriter, HostBuffers
from speechperf.results.progress import Progress
from speechperf.results.run import Run
from tests.conftest import cli_start

CONFIG = {"preset": "tiny", "model": {"name": "ds2"}, "train": {"seed": 1}}
ENV = {"cpu_model": "Test CPU", "cpu_cores_logical": 2, "gpus": []}


def _state():
    """A small model and its Adadelta state after one step (per-parameter dicts, step tensors)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv1d(3, 4, 3), torch.nn.BatchNorm1d(4), torch.nn.Flatten(),
                                torch.nn.Linear(8, 2))
    opt = torch.optim.Adadelta(model.parameters(), lr=0.5)
    model(torch.randn(5, 3, 4)).square().sum().backward()
    opt.step()
    return model, opt


def _train_on(model, opt):
    """One more step: changes every parameter and optimizer tensor in place."""
    opt.zero_grad()
    model(torch.randn(5, 3, 4)).square().sum().backward()
    opt.step()


def _run(folder):
    return Run.create(folder, kind="train", config=CONFIG, env=ENV, label="probe")


def _assert_same(a, b, where="checkpoint"):
    """Equal structure, types and values, tensors bit for bit (with dtype and shape)."""
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
        assert getattr(a, "__dict__", {}) == getattr(b, "__dict__", {}), where  # a state_dict's _metadata
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


class _Gate:
    """An injected save that waits for ``open`` before writing: the write is in flight meanwhile."""

    def __init__(self):
        self.started, self.gate = threading.Event(), threading.Event()

    def __call__(self, obj, path):
        self.started.set()
        assert self.gate.wait(30)
        atomic_torch_save(obj, path)


def test_a_background_write_equals_a_synchronous_save_of_the_state_at_the_call(tmp_path):
    model, opt = _state()
    state = lambda: {checkpoint.MODEL: model.state_dict(), checkpoint.OPTIMIZER: opt.state_dict()}  # noqa: E731
    prog = Progress(iteration=7, epoch=2, start_batch=3)
    with _run(tmp_path / "sync") as run:
        checkpoint.save(run, prog, state())
    save = _Gate()
    with _run(tmp_path / "bg") as run:
        writer = run.checkpoint_writer(save)  # bound to the run's checkpoint file
        checkpoint.save(run, prog, state(), writer)
        assert save.started.wait(30) and writer.in_flight
        _train_on(model, opt)  # the live tensors change while the write waits to start
        save.gate.set()
        written = writer.wait()
    assert written.path == tmp_path / "bg" / "checkpoint.pt" and written.iteration == 7 and written.write_s > 0
    sync, bg = checkpoint.load(tmp_path / "sync"), checkpoint.load(tmp_path / "bg")
    sync.pop(checkpoint.RUN_ID), bg.pop(checkpoint.RUN_ID)  # each folder's own run
    assert type(bg[checkpoint.MODEL]) is OrderedDict
    _assert_same(sync, bg)
    assert not torch.equal(bg[checkpoint.MODEL]["0.weight"], model.state_dict()["0.weight"])  # not the step after


def test_a_write_error_is_raised_at_the_next_wait_naming_the_file(tmp_path):
    def broken(obj, path):
        raise OSError(errno.EIO, "Input/output error")

    with _run(tmp_path / "run") as run:
        writer = run.checkpoint_writer(broken)
        checkpoint.save(run, Progress(iteration=3), {"model": {"w": torch.ones(2)}}, writer)  # returns: in flight
        with pytest.raises(CheckpointWriteError) as e:
            checkpoint.save(run, Progress(iteration=6), {"model": {"w": torch.ones(2)}}, writer)  # the next wait
    path = tmp_path / "run" / "checkpoint.pt"
    assert str(path) in str(e.value) and "Input/output error" in str(e.value) and e.value.exit_code == 1
    assert isinstance(e.value.__cause__, OSError)
    assert writer.wait() is None  # raised once, then nothing is in flight
    assert not path.exists()  # nothing was written after the failed write: the run stopped at it


def test_a_full_disk_is_raised_at_the_next_wait_as_the_named_disk_full_error(tmp_path):
    path = tmp_path / "checkpoint.pt"

    def full(obj, path):
        raise DiskFullError.writing(path)

    writer = CheckpointWriter(path, full)
    writer.write({"w": torch.ones(2)}, 1)
    with pytest.raises(DiskFullError, match="disk full while writing .*checkpoint.pt"):
        writer.wait()


def test_host_buffers_are_reused_and_a_tensor_held_twice_stays_one():
    w = torch.arange(6.0).reshape(2, 3).t()  # not contiguous
    buffers = HostBuffers()
    first = buffers.snapshot({"a": w, "b": [w, (1, "x")], "c": 2.5})
    assert first["a"] is first["b"][0] and torch.equal(first["a"], w) and first["b"][1] == (1, "x")
    ptr = first["a"].data_ptr()
    w.add_(1)
    second = buffers.snapshot({"a": w, "b": [w, (1, "x")], "c": 2.5})
    assert second["a"].data_ptr() == ptr and torch.equal(second["a"], w)  # the same buffer, the new values
    third = buffers.snapshot({"a": torch.ones(4, dtype=torch.float64)})  # another shape and dtype: a new buffer
    assert third["a"].data_ptr() != ptr and third["a"].dtype == torch.float64


@pytest.mark.timeout(120)
def test_a_kill_while_a_write_is_in_flight_leaves_the_previous_checkpoint(tmp_path):
    folder, marker = tmp_path / "run", tmp_path / "in-flight"
    p = cli_start(folder, marker, module="tests.results.in_flight_child")
    try:
        deadline = time.monotonic() + 60
        # save returned (the loop would train on) and half of the new file is on disk, the writer stalled there
        while not (marker.exists() and Path(f"{marker}.saved").exists()):  # in_flight_child's names
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read()
            time.sleep(0.01)
    finally:
        p.kill()
        p.wait()
    assert list(folder.glob(".checkpoint.pt.*.tmp"))  # the write the kill cut short
    ckpt = checkpoint.load(folder)  # the previous one, whole
    assert ckpt[checkpoint.PROGRESS]["iteration"] == 3
    assert torch.equal(ckpt[checkpoint.MODEL]["w"], torch.full((1000,), 3.0))
