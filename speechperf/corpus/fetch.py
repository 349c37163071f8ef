"""``speechperf corpus fetch {librispeech,mini-librispeech} OUT``: get a real corpus, verified.

For each part (a split: dev-clean, train-clean-100, ...; Mini LibriSpeech: dev-clean-2,
train-clean-5), in order: skip it when ``OUT/SPLIT`` carries the completion marker (reruns
fetch and extract nothing); else download ``OUT/.fetch/PART.tar.gz`` (resumable, checked
against the size and checksums shipped in ``librispeech_parts.toml``: ``download.py``),
extract it all-or-nothing into ``OUT/SPLIT`` (``archive.py``) and delete the archive
(``keep_archives`` keeps it). ``OUT`` is then a corpus folder ``speechperf prepare OUT FEATS``
reads as it is, like one ``corpus synth`` makes.

``mirror`` replaces the base address of OpenSLR's resources (``https://www.openslr.org/resources``),
e.g. ``https://us.openslr.org/resources`` or ``https://openslr.elda.org/resources``: part
``12/dev-clean.tar.gz`` is fetched from ``MIRROR/12/dev-clean.tar.gz``.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from speechperf.corpus.archive import MARKER, WORKDIR, extract_part
from speechperf.corpus.download import FetchError, download
from speechperf.corpus.parts import Part, load_table

OPENSLR = "https://www.openslr.org/resources"  # the base address --mirror replaces


def fetch_corpus(corpus: str, out: Path, parts: list[str] | None = None, mirror: str | None = None,
                 keep_archives: bool = False, timeout: float = 60.0, progress: bool = True) -> list[dict]:
    """Fetch ``parts`` (default: all) of ``corpus`` into ``out``; one row per part."""
    table = load_table()
    chosen = _choose(table, corpus, parts)
    base = (mirror or OPENSLR).rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise FetchError(f"--mirror {mirror!r} is not an http(s) address (e.g. https://us.openslr.org/resources)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    todo = [p for p in chosen if not (out / p.name / MARKER).exists()]
    for p in todo:
        if (out / p.name).exists():
            raise FetchError(f"{out / p.name} exists but corpus fetch did not complete it (no {MARKER} in it): "
                             f"move or delete it, then run again")
    _check_space(out, todo, keep_archives)
    return [_fetch_part(p, out, base, keep_archives, timeout, progress) for p in chosen]


def _choose(table, corpus: str, parts: list[str] | None) -> list[Part]:
    if corpus not in table.corpora:
        raise FetchError(f"unknown corpus {corpus!r}: known {', '.join(sorted(table.corpora))}")
    known = table.corpora[corpus]
    names = list(dict.fromkeys(parts)) if parts else known
    unknown = [n for n in names if n not in known]
    if unknown:
        raise FetchError(f"{corpus} has no part {', '.join(unknown)}: its parts are {', '.join(known)}")
    chosen = [table.parts[n] for n in names]
    unverified = [f"{p.name} ({p.unverified})" for p in chosen if p.unverified]
    if unverified:
        raise FetchError(f"refusing to fetch {', '.join(unverified)}: {table.file} has no published size and "
                         "checksum to verify it against; add them there (with their source), or fetch other --parts")
    return chosen


def _check_space(out: Path, todo: list[Part], keep_archives: bool) -> None:
    """Refuse before downloading what cannot fit: the archives still to download, plus the
    largest one again while it is extracted (the archive is deleted after extraction unless
    kept). An estimate: FLAC in a .tar.gz extracts to about the archive's size."""
    if not todo:
        return
    pending = sum(p.bytes - _on_disk(out, p) for p in todo)
    extracted = sum(p.bytes for p in todo) if keep_archives else max(p.bytes for p in todo)
    need, free = pending + extracted, shutil.disk_usage(out).free
    if free < need:
        raise FetchError(f"{out} has {free / 1e9:.1f} GB free; fetching {', '.join(p.name for p in todo)} needs about "
                         f"{need / 1e9:.1f} GB ({pending / 1e9:.1f} GB to download, {extracted / 1e9:.1f} GB while "
                         "extracting): free space, or fetch fewer --parts at a time")


def _on_disk(out: Path, part: Part) -> int:
    """Bytes of this part's archive already downloaded (whole or in part)."""
    archive = out / WORKDIR / part.archive_name
    partial = archive.with_name(archive.name + ".part")
    return archive.stat().st_size if archive.exists() else partial.stat().st_size if partial.exists() else 0


def _fetch_part(part: Part, out: Path, base: str, keep_archives: bool, timeout: float, progress: bool) -> dict:
    url = f"{base}/{part.path}"
    row = {"part": part.name, "status": "already fetched", "downloaded_bytes": 0, "archive_bytes": part.bytes,
           "members": None, "folder": str(out / part.name)}
    if (out / part.name / MARKER).exists():
        return row
    archive = out / WORKDIR / part.archive_name
    if archive.exists() and archive.stat().st_size != part.bytes:  # renamed only once verified: a foreign file
        raise FetchError(f"{archive} is {archive.stat().st_size} bytes, not the published {part.bytes}: delete it "
                         "and run again")
    if not archive.exists():
        archive.parent.mkdir(parents=True, exist_ok=True)
        row["downloaded_bytes"] = download(url, archive, part, timeout=timeout, progress=progress)
    marker = {"part": part.name, "url": url, "bytes": part.bytes, **part.hashes}
    row["members"] = extract_part(archive, out, part.name, marker, progress=progress)
    if not keep_archives:
        archive.unlink()
    row["status"] = "fetched"
    return row

