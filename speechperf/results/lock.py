"""One writer per run folder: an exclusive lock that a second process is refused by.

Two ``train`` commands on one folder would both write it (two run ids, doubled iteration
rows, two ``run_start`` lines). The writer holds a POSIX record lock (``fcntl.lockf``) on
``RUN/.speechperf.lock`` for as long as it runs; the kernel releases it when the process
ends, however it ends, so a lock left by a killed process never blocks the command that
continues its run. A POSIX lock, not ``flock``: an flock is shared with the children a
process forks (DataLoader's reader processes), which outlive a SIGKILLed parent by seconds
and kept the folder locked against its own resume; a POSIX lock belongs to the process
alone. The file holds the holder's pid and host, for the message the second process exits
with (2).

The lock is advisory; over NFS it holds across hosts only where the server supports POSIX
locks: the host in the message says which machine to look at.
"""
from __future__ import annotations

import fcntl
import os
import socket
import struct
from pathlib import Path

from speechperf.errors import SpeechperfError

LOCK_FILE = ".speechperf.lock"


class RunFolderBusy(SpeechperfError):
    """Another process holds the run folder's lock; the message names its pid and host."""


class RunLock:
    """``with RunLock(folder):`` or ``acquire()`` / ``release()``; the folder must exist."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        """Take the lock or raise :class:`RunFolderBusy` naming the holder (never waits)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, PermissionError):  # EAGAIN or EACCES: held by another process
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").split()
            os.close(fd)
            pid, host = (holder + ["?", "?"])[:2]
            raise RunFolderBusy(f"{self.path.parent} is in use by another speechperf process (pid {pid} on host "
                                f"{host}): wait for it to end or stop it; one run folder takes one writer") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


# struct flock as Linux lays it out (l_type, l_whence, l_start, l_len, l_pid, padded to 32 bytes)
_FLOCK = "hhqqi4x"


def held(folder: Path) -> bool | None:
    """Whether another process holds ``folder``'s lock now (a run training there), asked without
    taking it and without writing (``F_GETLK`` on the file opened read-only: a reader of a
    read-only or copied folder can ask). False where no lock file is there; None where the system
    cannot say (not Linux's struct layout). The process asking never counts: a lock it holds is
    its own, not another writer's."""
    try:
        fd = os.open(Path(folder) / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        asked = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        found = struct.unpack(_FLOCK, fcntl.fcntl(fd, fcntl.F_GETLK, asked))
    except (OSError, struct.error):
        return None
    finally:
        os.close(fd)
    return found[0] != fcntl.F_UNLCK
