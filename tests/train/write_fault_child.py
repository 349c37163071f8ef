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


def stall(obj, path, marker: str) -> None:
    """Writes half of ``obj``'s file into the temporary file beside ``path``, then stalls there;
    the ``marker`` file, which says so, holds the checkpoint's iteration."""
    def write(f):
        data = io.BytesIO()
        torch.save(obj, data)
        f.write(data.getvalue()[: len(data.getvalue()) // 2])
        f.flush()
        with open(marker, "w") as m:
            m.write(str(obj["progress"]["iteration"]))
        threading.Event().wait()
    atomic.atomic_write(path, write)


def main(argv: list[str]) -> int:
    how, marker, real = argv[0], argv[1], atomic.atomic_torch_save

    def injected(obj, path):
        p = obj["progress"]
        if how == "stall" and p["epoch"] == 2 and p["start_batch"] == 0:
            return stall(obj, path, marker)
        if (how == "fail-6" and p["iteration"] == 6) or (how == "fail-final" and p["status"] is not None):
            raise OSError(errno.EIO, "Input/output error")
        return real(obj, path)

    atomic.atomic_torch_save = injected
    from speechperf.cli import main as cli

    return cli(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
