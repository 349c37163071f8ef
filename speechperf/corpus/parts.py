"""The table of archives ``corpus fetch`` may download: ``librispeech_parts.toml``.

Every part of OpenSLR 12 (LibriSpeech) and 31 (Mini LibriSpeech) with its path under
OpenSLR's resources, its size in bytes and its published checksums, each value with its
sources (the file's header says where they come from). A part without a size or checksum
carries ``unverified = "why"`` and is refused by ``fetch``: nothing is downloaded unverified.

The shipped table is used everywhere; ``SPEECHPERF_FETCH_TABLE=FILE`` (same schema) replaces
it, for tests and for mirrors of your own that serve other archives.
"""
from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from speechperf.errors import SpeechperfError

SHIPPED = Path(__file__).with_name("librispeech_parts.toml")
ENV = "SPEECHPERF_FETCH_TABLE"  # a table of your own (tests, private mirrors)
HASHES = {"md5": 32, "sha256": 64}  # checksum name -> hex digits


class TableError(SpeechperfError):
    """The table of parts is malformed (a missing or wrong value, named)."""


@dataclass(frozen=True)
class Part:
    name: str  # split name, also the folder inside the archive (LibriSpeech/NAME)
    path: str  # relative to the resources' base address, e.g. "12/dev-clean.tar.gz"
    bytes: int | None  # archive size; None: unknown (the part is refused)
    hashes: dict  # {"md5": hex, "sha256": hex}: every one is checked
    unverified: str  # why the part cannot be verified; "" when it can

    @property
    def archive_name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Table:
    file: Path  # where it was read from
    corpora: dict  # corpus name -> list of part names
    parts: dict  # part name -> Part


def table_path() -> Path:
    """The shipped table, or the one ``SPEECHPERF_FETCH_TABLE`` names."""
    return Path(os.environ[ENV]) if os.environ.get(ENV) else SHIPPED


def load_table(path: Path | None = None) -> Table:
    """Read and check the table (the shipped one unless ``path`` or the environment says)."""
    path = Path(path) if path else table_path()
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise TableError(f"table of parts {path} cannot be read: {e}") from None
    parts = {name: _part(path, name, entry) for name, entry in data.get("part", {}).items()}
    corpora = {}
    for name, entry in data.get("corpus", {}).items():
        listed = list(entry.get("parts", []))
        unknown = [p for p in listed if p not in parts]
        if not listed or unknown:
            raise TableError(f"{path}: corpus {name!r} lists "
                             f"{'unknown parts ' + str(unknown) if unknown else 'no parts'}")
        corpora[name] = listed
    if not corpora:
        raise TableError(f"{path}: no [corpus.NAME] section")
    return Table(path, corpora, parts)


def _part(file: Path, name: str, entry: dict) -> Part:
    where = f"{file}: part {name!r}"
    rel = entry.get("path")
    if not isinstance(rel, str) or not rel.endswith(".tar.gz") or rel.startswith("/") or ".." in rel.split("/"):
        raise TableError(f"{where}: path must be a relative .../NAME.tar.gz, got {rel!r}")
    size = entry.get("bytes")
    if size is not None and (not isinstance(size, int) or size <= 0):
        raise TableError(f"{where}: bytes must be a positive integer, got {size!r}")
    hashes = {}
    for algo, digits in HASHES.items():
        value = entry.get(algo)
        if value is None:
            continue
        if not isinstance(value, str) or not re.fullmatch(f"[0-9a-f]{{{digits}}}", value):
            raise TableError(f"{where}: {algo} must be {digits} lower-case hex digits, got {value!r}")
        hashes[algo] = value
    unverified = str(entry.get("unverified", ""))
    if not unverified and (size is None or not hashes):
        unverified = "no published size" if size is None else "no published checksum"
    return Part(name, rel, size, hashes, unverified)
