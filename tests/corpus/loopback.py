"""A loopback OpenSLR for the fetch tests: an HTTP server on 127.0.0.1 (a thread) with Range
support written here and switches to fail, and small .tar.gz archives in the LibriSpeech
layout (FLAC written with soundfile) with a table of parts of their own."""
from __future__ import annotations

import hashlib
import io
import re
import tarfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import soundfile as sf

WORDS = ["HELLO", "WORLD", "GOOD", "MORNING", "A", "DOG'S", "BONE", "READ", "THE", "BOOK"]


def flac_bytes(seconds: float, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    audio = 0.3 * np.sin(2 * np.pi * rng.uniform(200, 600) * t) + 0.02 * rng.standard_normal(len(t))
    buf = io.BytesIO()
    sf.write(buf, audio.astype(np.float32), 16000, format="FLAC")
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 1_500_000_000, 0o644
    tar.addfile(info, io.BytesIO(data))


def make_archive(split: str, speakers=(19, 26), utterances: int = 3, extra=None, seed: int = 0) -> bytes:
    """A .tar.gz of LibriSpeech/SPLIT/SPEAKER/CHAPTER/*.flac + *.trans.txt (+ README.TXT), as
    OpenSLR's; ``extra(tar)`` adds members of a test's own (unsafe ones)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        _add(tar, "LibriSpeech/README.TXT", b"a loopback LibriSpeech\n")
        for k, spk in enumerate(speakers):
            chapter = 100 + k
            base = f"LibriSpeech/{split}/{spk}/{chapter}"
            lines = []
            for i in range(utterances):
                uid = f"{spk}-{chapter}-{i:04d}"
                rng = np.random.default_rng(seed * 1000 + spk * 10 + i)
                lines.append(f"{uid} {' '.join(rng.choice(WORDS, size=3))}")
                _add(tar, f"{base}/{uid}.flac", flac_bytes(1.0 + 0.2 * i, seed * 1000 + spk * 10 + i))
            _add(tar, f"{base}/{spk}-{chapter}.trans.txt", ("\n".join(lines) + "\n").encode())
        if extra:
            extra(tar)
    return buf.getvalue()


def table_text(archives: dict, corpus: str = "mini-librispeech", resource: int = 31, skip=()) -> str:
    """A table of parts (librispeech_parts.toml's schema) for ``archives`` {part: bytes}."""
    lines = [f'[corpus.{corpus}]', f"resource = {resource}", f"parts = {list(archives)!r}".replace("'", '"')]
    for name, data in archives.items():
        lines += [f"[part.{name}]", f'path = "{resource}/{name}.tar.gz"']
        if name not in skip:
            lines += [f"bytes = {len(data)}", f'md5 = "{hashlib.md5(data).hexdigest()}"',
                      f'sha256 = "{hashlib.sha256(data).hexdigest()}"']
    return "\n".join(lines) + "\n"


class Loopback:
    """The server's state: ``files`` {url path: bytes}; ``mode`` one of ok, 404, 500,
    close_mid (send ``cut`` bytes of the body, then close), slow (headers, then ``delay`` s of
    silence), throttle (``rate`` bytes/s), ignore_range (answer 200 with the whole file),
    redirect_loop (302 back to the same address);
    ``log``: one (path, range start, body bytes sent) per answered GET."""

    def __init__(self):
        self.files, self.mode, self.cut, self.delay, self.rate, self.log = {}, "ok", 0, 0.0, 0, []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.state = self
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/resources"

    def serve(self, part: str, data: bytes, resource: int = 31) -> None:
        self.files[f"/resources/{resource}/{part}.tar.gz"] = data

    def sent(self, path_end: str) -> int:
        return sum(n for p, _, n in self.log if p.endswith(path_end))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        st: Loopback = self.server.state
        if st.mode == "redirect_loop":
            self.send_response(302)
            self.send_header("Location", self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if st.mode in ("404", "500") or self.path not in st.files:
            self.send_error(500 if st.mode == "500" else 404)
            return
        data = st.files[self.path]
        m = re.match(r"bytes=(\d+)-", self.headers.get("Range", ""))
        start = int(m.group(1)) if m and st.mode != "ignore_range" else 0
        if start >= len(data) and start:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(data)}")
            self.end_headers()
            return
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        self._body(st, data[start:], start)

    def _body(self, st: Loopback, body: bytes, start: int) -> None:
        if st.mode == "slow":
            time.sleep(st.delay)
        if st.mode == "close_mid":
            body = body[:st.cut]
        sent = 0
        try:
            step = max(1, st.rate // 20) if st.mode == "throttle" else len(body) or 1
            for i in range(0, len(body), step):
                self.wfile.write(body[i:i + step])
                self.wfile.flush()
                sent += len(body[i:i + step])
                if st.mode == "throttle":
                    time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            st.log.append((self.path, start, sent))
        self.close_connection = True


def write_table(folder: Path, archives: dict, **kw) -> Path:
    path = Path(folder) / "parts.toml"
    path.write_text(table_text(archives, **kw))
    return path
