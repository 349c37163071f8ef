"""Resumable, verified HTTP downloads of one archive: ``download(url, dest, part, ...)``.

Bytes go to ``DEST.part`` beside the target; an interrupted download continues where it
stopped (HTTP Range), and a server that ignores Range (200 instead of 206) restarts the
file cleanly. The file is hashed as it arrives (the bytes already there first), checked
against the table's size and every checksum, and renamed to ``DEST`` only when they all
match: ``DEST`` exists only as a verified archive. A checksum mismatch deletes the
``.part`` file (its bytes cannot be trusted); every other failure keeps it for the next run.

Built on the standard library (``urllib.request``), not lhotse's ``resumable_download``
(lhotse 1.33): that one writes into the target itself (a half-downloaded archive looks
like a whole one), appends a 200 answer to a Range request after the bytes already there
(a corrupt file where a server ignores Range), checks no size or checksum, sets no timeout
and lets urllib's exceptions through. ``requests`` would add nothing needed here.
Every failure is a ``FetchError`` naming the URL, the file and what to do.
"""
from __future__ import annotations

import hashlib
import http.client
import os
import re
import socket
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

from speechperf.corpus.parts import Part
from speechperf.errors import SpeechperfError

CHUNK = 1 << 20  # bytes per read: the progress bar's and the hash's step
MIRROR_HINT = "https://us.openslr.org/resources"  # a mirror to suggest in messages


class FetchError(SpeechperfError):
    """A download, verification or extraction failed; the message names the URL or file and what to do."""


def download(url: str, dest: Path, part: Part, timeout: float = 60.0, progress: bool = True) -> int:
    """Download ``url`` to ``dest`` through ``dest.part``, verified; returns the bytes transferred now."""
    tmp = dest.with_name(dest.name + ".part")
    have = tmp.stat().st_size if tmp.exists() else 0
    if have > part.bytes:  # longer than the archive: not a prefix of it
        tmp.unlink()
        have = 0
    hashers = {algo: hashlib.new(algo) for algo in part.hashes}
    _hash_file(tmp, have, hashers)
    got = 0
    if have < part.bytes:
        got = _transfer(url, tmp, have, part, hashers, timeout, progress)
    _verify(url, tmp, part, hashers)
    os.replace(tmp, dest)
    return got


def _hash_file(path: Path, size: int, hashers: dict) -> None:
    """Feed the bytes already downloaded to the hashes, so one pass over the network suffices."""
    if not size:
        return
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            for h in hashers.values():
                h.update(chunk)


def _transfer(url: str, tmp: Path, have: int, part: Part, hashers: dict, timeout: float, progress: bool) -> int:
    resp = _open(url, tmp, have, part, timeout)
    with resp:
        if have and resp.status == 200:  # the server ignored Range: it sends the whole file
            have = 0
            for algo in hashers:
                hashers[algo] = hashlib.new(algo)
        elif have:
            _check_range(url, tmp, resp, have, part)
        length = resp.headers.get("Content-Length")
        if length is not None and int(length) != part.bytes - have:
            raise FetchError(f"{url}: the server announces {int(length) + have} bytes for {part.archive_name}, the "
                             f"published size is {part.bytes}: a different file (check --mirror, or try "
                             f"--mirror {MIRROR_HINT})")
        return _copy(url, resp, tmp, have, part, hashers, timeout, progress)


def _open(url: str, tmp: Path, have: int, part: Part, timeout: float):
    headers = {"User-Agent": "speechperf corpus fetch", **({"Range": f"bytes={have}-"} if have else {})}
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # our prefix does not fit what the server holds: start over
            tmp.unlink()
            return _open(url, tmp, 0, part, timeout)
        raise FetchError(_http_message(url, part, e, tmp, have)) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        what = f"no answer within {timeout:g} s" if isinstance(reason, (TimeoutError, socket.timeout)) else \
            f"cannot connect ({reason})"
        raise FetchError(f"{url}: {what} while fetching {part.archive_name}; {_again(tmp, have)}, or use "
                         f"another --mirror (e.g. {MIRROR_HINT})") from None


def _http_message(url: str, part: Part, e: urllib.error.HTTPError, tmp: Path, have: int) -> str:
    if 300 <= e.code < 400:  # urllib gives up on a redirect loop (or past 10 redirects) with a 3-line reason
        most = urllib.request.HTTPRedirectHandler.max_redirections
        return (f"{url}: the server redirects in a loop (or more than {most} times; last HTTP {e.code}) while fetching "
                f"{part.archive_name}; check the address (--mirror), or use another --mirror (e.g. {MIRROR_HINT})")
    reason = " ".join(str(e.reason).split())  # one line, whatever the server sent
    head = f"{url}: HTTP {e.code} {reason} while fetching {part.archive_name}"
    if e.code in (404, 410):
        return (f"{head}: no such file at this address; check --mirror (it replaces the base address "
                f"https://www.openslr.org/resources, e.g. --mirror {MIRROR_HINT})")
    if e.code >= 500:
        return f"{head}: the server failed; {_again(tmp, have)} later, or use another --mirror (e.g. {MIRROR_HINT})"
    return f"{head}; check the address (--mirror) and {_again(tmp, have)}"


def _check_range(url: str, tmp: Path, resp, have: int, part: Part) -> None:
    """A 206 answer must continue exactly where our file stops."""
    m = re.match(r"bytes (\d+)-", resp.headers.get("Content-Range", ""))
    if resp.status != 206 or not m or int(m.group(1)) != have:
        raise FetchError(f"{url}: asked for bytes from {have} of {part.archive_name}, the server answered "
                         f"{resp.status} {resp.headers.get('Content-Range', 'without Content-Range')}; delete "
                         f"{tmp} and run again, or use another --mirror")


def _copy(url: str, resp, tmp: Path, have: int, part: Part, hashers: dict, timeout: float, progress: bool) -> int:
    want, written = part.bytes - have, 0
    with open(tmp, "ab" if have else "wb") as f, \
            tqdm(total=part.bytes, initial=have, unit="B", unit_scale=True, unit_divisor=1024,
                 desc=part.archive_name, disable=not progress) as bar:
        while written < want:
            try:
                chunk = resp.read1(min(CHUNK, want - written))  # what has arrived: written at once
            except (TimeoutError, socket.timeout):
                raise FetchError(f"{url}: no data for {timeout:g} s while fetching {part.archive_name} "
                                 f"({have + written} of {part.bytes} bytes); {_again(tmp, have + written)}, "
                                 f"or use another --mirror (e.g. {MIRROR_HINT})") from None
            except (http.client.HTTPException, OSError) as e:
                raise FetchError(f"{url}: connection lost ({type(e).__name__}) after {have + written} of "
                                 f"{part.bytes} bytes of {part.archive_name}; {_again(tmp, have + written)}") from None
            if not chunk:
                break
            f.write(chunk)
            for h in hashers.values():
                h.update(chunk)
            written += len(chunk)
            bar.update(len(chunk))
    if written < want:
        raise FetchError(f"{url}: the server closed the connection after {have + written} of {part.bytes} bytes "
                         f"of {part.archive_name} (short read); {_again(tmp, have + written)}")
    return written


def _again(tmp: Path, have: int) -> str:
    if have:
        return f"the {have} bytes so far are kept in {tmp}: run the same command again to resume"
    return "run the same command again"


def _verify(url: str, tmp: Path, part: Part, hashers: dict) -> None:
    size = tmp.stat().st_size
    bad = [] if size == part.bytes else [f"{size} bytes, not the published {part.bytes}"]
    bad += [f"{algo} {h.hexdigest()}, not the published {part.hashes[algo]}"
            for algo, h in hashers.items() if h.hexdigest() != part.hashes[algo]]
    if bad:
        tmp.unlink()
        raise FetchError(f"{url}: the downloaded {part.archive_name} has {'; '.join(bad)} (a corrupted transfer, "
                         f"or the mirror serves another file): deleted {tmp}; run the same command again to "
                         f"download it anew, or use another --mirror (e.g. {MIRROR_HINT})")
