"""``python -m tests.train.write_fault_child HOW MARKER ARGS...`` (tests/forked_cli.py forks it from the
suite's server): ``speechperf ARGS`` whose checkpoint writes go wrong as HOW says. ``stall`` puts
half of the first epoch-end checkpoint into its temporary file and stalls there (the MARKER
file says so) while the loop trains on; ``fail-6`` and ``fail-final`` fail the write of
iteration 6's checkpoint or of the final one (saved before the final evaluation) with an I/O
error."""
import errno
import io
import sys
import threading

import torch

import speechperf.atomic as atomic

real, how, marker = atomic.atomic_torch_save, sys.argv[1], sys.argv[2]


def stall(obj, path):
    def write(f):
        data = io.BytesIO()
        torch.save(obj, data)
        f.write(data.getvalue()[: len(data.getvalue()) // 2])
        f.flush()
        with open(marker, "w") as m:
            m.write(str(obj["progress"]["iteration"]))
        threading.Event().wait()
    atomic.atomic_write(path, write)


def injected(obj, path):
    p = obj["progress"]
    if how == "stall" and p["epoch"] == 2 and p["start_batch"] == 0:
        return stall(obj, path)
    if (how == "fail-6" and p["iteration"] == 6) or (how == "fail-final" and p["status"] is not None):
        raise OSError(errno.EIO, "Input/output error")
    return real(obj, path)


atomic.atomic_torch_save = injected
from speechperf.cli import main  # noqa: E402

sys.exit(main(sys.argv[3:]))
