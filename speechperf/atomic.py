"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Every artefact that a later step trusts (shards, indexes, checkpoints, summaries) goes
through here, so that a killed process or a full disk leaves the previous version intact.
"""
from __future__ import annotations

import errno
import io
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from speechperf.errors import MachineFault

# Below this many free bytes a failed write is taken for a full disk even when the writer
# hid the OSError (torch.save reports ENOSPC as "RuntimeError: ... unexpected pos").
FULL_BYTES = 1 << 20
TMP_PREFIX, TMP_SUFFIX = ".", ".tmp"  # an atomic write's temporary: ".NAME.XXXXXXXX.tmp" beside NAME


class DiskFullError(MachineFault, OSError):
    """Writing failed for lack of space; names the file and what is kept."""

    @classmethod
    def writing(cls, path, detail: str = "") -> "DiskFullError":
        """The error for a write to ``path`` that found the disk full; ``detail``: the
        writer's own words (sqlite's, torch's)."""
        return cls(errno.ENOSPC, f"disk full while writing {path}{f' ({detail})' if detail else ''}: free space "
                                 "there and run the same command again (the previous version of the file is kept; "
                                 "a run continues from its last checkpoint)")


def disk_full(e: BaseException, where: Path) -> bool:
    """Whether ``e`` (or an error it wraps) is a full disk, or ``where``'s disk is full now."""
    seen = e
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    try:
        return shutil.disk_usage(where).free < FULL_BYTES
    except OSError:
        return False


def atomic_write(path: str | Path, write: Callable[[io.BufferedWriter], None]) -> None:
    """Call ``write(f)`` on a temporary file beside ``path``, fsync, then rename over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        _remove(tmp)
        if disk_full(e, path.parent):
            raise DiskFullError.writing(path) from e
        raise
    except BaseException:
        _remove(tmp)
        raise


def remove_leftovers(folder: Path, recursive: bool = False) -> None:
    """Remove the temporaries :func:`atomic_write` left in ``folder`` (and below it, ``recursive``)
    when a SIGKILL came between their creation and their rename: half-written files a later write
    never reuses (a checkpoint's is gigabytes). Only for the folder's one writer: another process's
    write in flight would lose its temporary."""
    for stale in Path(folder).glob(f"{'**/' if recursive else ''}{TMP_PREFIX}*{TMP_SUFFIX}"):
        stale.unlink(missing_ok=True)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_torch_save(obj, path: str | Path) -> None:
    import torch  # heavy: the atomic writers serve light commands too

    atomic_write(path, lambda f: torch.save(obj, f))


def _remove(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
