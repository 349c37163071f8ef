"""Safe, all-or-nothing extraction of one verified LibriSpeech archive into the corpus folder.

``extract_part(archive, out, split, marker)`` unpacks ``LibriSpeech/SPLIT/...`` from the
archive into a work folder inside OUT, writes the completion marker into the split's
folder and only then renames the folder to ``OUT/SPLIT``: a split folder exists complete
with its marker or not at all, so an interrupted extraction never looks complete (the next
run removes the work folder and extracts again). The archive's top-level notes
(README.TXT, SPEAKERS.TXT, ...) go to OUT beside the splits. The result is the layout
``speechperf prepare OUT FEATS`` reads (``OUT/SPLIT/SPEAKER/CHAPTER/*.flac``, ``*.trans.txt``).

Anything but what a LibriSpeech part holds is refused (``UnsafeArchive``, naming the archive
and the member) while extracting, before anything is moved into OUT: absolute paths and
``..``; links of any kind (LibriSpeech has none, and a relative link that stays inside the
work folder may point outside OUT once renamed; a hardlink may name a missing member),
devices and fifos; a member outside ``LibriSpeech/SPLIT/`` other than a top-level note
(``LibriSpeech/NAME.TXT``), e.g. another split's folder or a ``LibriSpeech/.fetch`` that
would land on the work folder; a name of more than 255 bytes, or any named like the fetch's
marker; a name that is a file and a folder. tarfile's ``data`` extraction filter (Python >= 3.11.4,
3.10.12) applies as well where it exists.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import tarfile
import zlib
from pathlib import Path

from tqdm import tqdm

from speechperf.atomic import atomic_write_text
from speechperf.corpus.download import FetchError

WORKDIR = ".fetch"  # OUT/.fetch: archives, .part files and extraction work folders
MARKER = ".speechperf-fetch.json"  # in OUT/SPLIT: written before the folder appears
HAS_DATA_FILTER = hasattr(tarfile, "data_filter")
NAME_MAX = 255  # bytes in one path component: Linux's ext4, xfs, btrfs and tmpfs, macOS's APFS
PATH_MAX = 4096  # bytes in a whole path, its NUL included (Linux's), where the file system does not say


class UnsafeArchive(FetchError):
    """An archive member would land outside the folder, is a link, device or fifo, or is not of the part."""


def extract_part(archive: Path, out: Path, split: str, marker: dict, progress: bool = True) -> int:
    """Extract ``LibriSpeech/SPLIT`` of ``archive`` to ``OUT/SPLIT`` all at once; returns the member count."""
    out = Path(out)
    work = out / WORKDIR / f"{split}.extract"
    shutil.rmtree(work, ignore_errors=True)  # a previous run's half-extracted folder
    work.mkdir(parents=True)
    try:
        count = _extract(archive, work, split, progress)
        root = work / "LibriSpeech"
        src = root / split
        if not src.is_dir():
            raise FetchError(f"{archive} holds no LibriSpeech/{split} folder: not the archive of {split}; "
                             f"delete it and run again, or check --mirror")
        if (out / split).exists():
            raise FetchError(f"{out / split} appeared during extraction: another fetch into {out}? run again")
        atomic_write_text(src / MARKER, json.dumps(marker, indent=1))
        for note in root.iterdir():
            if note.is_file():  # README.TXT, SPEAKERS.TXT, ...: the same in every part
                os.replace(note, out / note.name)
        os.rename(src, out / split)  # the split appears complete, marker included
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return count


def _extract(archive: Path, dest: Path, split: str, progress: bool) -> int:
    counted, kinds = [0], {}  # kinds: each name seen (its own or a folder's above it) -> is a folder
    path_max = _path_max(dest) - len(os.fsencode(str(dest))) - 1  # the bytes a member's name may take under dest

    def members(tar):
        for member in tar:
            _check_member(archive, member, split, path_max)
            _check_kind(archive, member, kinds)
            counted[0] += 1
            yield member

    try:
        with tqdm.wrapattr(open(archive, "rb"), "read", total=archive.stat().st_size, desc=f"extract {archive.name}",
                           disable=not progress) as raw, tarfile.open(fileobj=raw, mode="r|gz") as tar:
            kwargs = {"filter": "data"} if HAS_DATA_FILTER else {}
            tar.extractall(dest, members=members(tar), **kwargs)
    except tarfile.FilterError as e:
        raise UnsafeArchive(f"{archive}: refused member {e.tarinfo.name!r} ({e}); nothing of it was "
                            f"kept; the archive is not a LibriSpeech part: delete it, check --mirror") from None
    except (IsADirectoryError, NotADirectoryError, FileExistsError) as e:  # a backstop to _check_kind
        raise UnsafeArchive(f"{archive}: refused member {e.filename!r} ({e.strerror}); nothing of it was kept; "
                            "the archive is not a LibriSpeech part: delete it, check --mirror") from None
    except OSError as e:
        if e.errno != errno.ENAMETOOLONG:  # a full disk, a read-only folder: the machine's, not the archive's
            raise
        raise UnsafeArchive(f"{archive}: refused member {e.filename!r} ({e.strerror}); nothing of it was kept; "
                            "the archive is not a LibriSpeech part: delete it, check --mirror") from None
    except (tarfile.ReadError, EOFError, zlib.error) as e:
        raise FetchError(f"{archive} cannot be unpacked ({e}) although its checksum matched: delete it and run "
                         "again") from None
    return counted[0]


def _path_max(folder: Path) -> int:
    """The bytes a path may take on ``folder``'s file system (Linux: 4,096, the terminating NUL included)."""
    try:
        return os.pathconf(folder, "PC_PATH_MAX")
    except (OSError, ValueError):
        return PATH_MAX


def _check_member(archive: Path, member: tarfile.TarInfo, split: str, path_max: int = PATH_MAX) -> None:
    """Names must be relative and stay inside (the data filter would only strip a leading "/"),
    members plain files and folders, and each in its place: ``LibriSpeech/``, a note file
    ``LibriSpeech/NAME.TXT`` or anything under ``LibriSpeech/SPLIT``; the whole name, below the
    extraction folder, within ``path_max`` bytes."""
    parts = Path(member.name).parts
    if os.path.isabs(member.name) or ".." in parts:
        why = "outside the folder"
    elif not (member.isfile() or member.isdir()):
        kind = "a symlink" if member.issym() else "a hardlink" if member.islnk() else "a device or fifo"
        why = f"{kind}; a LibriSpeech part holds only files and folders"
    elif not _in_place(parts, split, member.isfile()):
        why = f"not under LibriSpeech/{split}/ nor a LibriSpeech/NAME.TXT note"
    elif any(len(os.fsencode(p)) > NAME_MAX for p in parts):
        why = f"a name longer than {NAME_MAX} bytes, which no file system here holds"
    elif len(os.fsencode(member.name)) >= path_max:
        why = f"a path of {len(os.fsencode(member.name))} bytes, longer than the file system's PATH_MAX holds"
    elif MARKER in parts:
        why = f"named like corpus fetch's own completion marker {MARKER}"
    else:
        return
    raise UnsafeArchive(f"{archive}: refused member {member.name!r} ({why}); nothing of it was kept; the "
                        "archive is not a LibriSpeech part: delete it, check --mirror")


def _check_kind(archive: Path, member: tarfile.TarInfo, kinds: dict) -> None:
    """A name is a file or a folder, never both: a file and a folder of one name (in either
    order, or a file where a later member needs a folder) failed extraction with a traceback."""
    parts = Path(member.name).parts
    for i in range(1, len(parts) + 1):
        name, folder = "/".join(parts[:i]), i < len(parts) or member.isdir()
        if kinds.setdefault(name, folder) != folder:
            was = "a folder" if kinds[name] else "a file"
            raise UnsafeArchive(f"{archive}: refused member {member.name!r} ({name!r} is {was} earlier in the "
                                "archive, here it is not); nothing of it was kept; the archive is not a LibriSpeech "
                                "part: delete it, check --mirror")


def _in_place(parts: tuple, split: str, is_file: bool) -> bool:
    if not parts or parts[0] != "LibriSpeech":
        return not parts and not is_file  # "." (the folder itself), or a member outside LibriSpeech/
    if len(parts) == 1:
        return not is_file
    if len(parts) == 2 and is_file:  # a note moved beside the splits: never a split's or the work folder's name
        return parts[1].upper().endswith(".TXT") and not parts[1].startswith(".")
    return parts[1] == split
