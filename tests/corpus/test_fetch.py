"""corpus fetch against a loopback OpenSLR (tests/corpus/loopback.py): full fetch, resume
without fetching a byte twice, a server that ignores Range, tampered and unsafe archives,
every network failure's message, idempotent reruns; the shipped table loads and is complete."""
from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import tarfile
import time

import pytest

from speechperf.corpus.archive import MARKER, WORKDIR, UnsafeArchive
from speechperf.corpus.download import FetchError
from speechperf.corpus.fetch import fetch_corpus
from speechperf.corpus.librispeech import scan_split
from speechperf.corpus.parts import ENV, SHIPPED, load_table
from tests.corpus.loopback import Loopback, make_archive, write_table

PARTS = ("dev-clean-2", "train-clean-5")


@pytest.fixture(scope="module")
def archives():
    return {"dev-clean-2": make_archive("dev-clean-2", speakers=(84,), seed=1),
            "train-clean-5": make_archive("train-clean-5", speakers=(19, 26), seed=2)}


@pytest.fixture
def openslr(archives, tmp_path, monkeypatch):
    """The loopback server serving both parts, and the table of parts pointing at them."""
    srv = Loopback()
    for name, data in archives.items():
        srv.serve(name, data)
    monkeypatch.setenv(ENV, str(write_table(tmp_path, archives)))
    yield srv
    srv.close()


def fetch(srv, out, **kw):
    return fetch_corpus("mini-librispeech", out, mirror=srv.base, progress=False, **kw)


def test_the_shipped_table_loads_and_has_every_part_verified_with_its_sources(monkeypatch):
    import tomllib

    monkeypatch.delenv(ENV, raising=False)
    table = load_table()
    assert table.file == SHIPPED
    assert table.corpora == {"librispeech": ["dev-clean", "dev-other", "test-clean", "test-other", "train-clean-100",
                                             "train-clean-360", "train-other-500"],
                             "mini-librispeech": ["dev-clean-2", "train-clean-5"]}
    raw = tomllib.loads(SHIPPED.read_text())
    for name, part in table.parts.items():
        assert not part.unverified and part.bytes > 10**8 and set(part.hashes) == {"md5", "sha256"}, name
        assert part.path == f"{12 if name in table.corpora['librispeech'] else 31}/{name}.tar.gz"
        for key in ("bytes", "md5", "sha256"):  # every value names sources the file describes
            sources = raw["part"][name][f"{key}_sources"]
            assert sources and set(sources) <= set(raw["sources"]), (name, key)
    # 960 h of training audio + dev/test: the published sizes add up to OpenSLR's ~60 GB
    assert 60.0e9 < sum(table.parts[p].bytes for p in table.corpora["librispeech"]) < 62.0e9


def test_fetch_unpacks_every_part_in_the_librispeech_layout_and_a_rerun_fetches_nothing(openslr, archives, tmp_path):
    out = tmp_path / "corpus"
    rows = fetch(openslr, out)
    assert [(r["part"], r["status"], r["downloaded_bytes"]) for r in rows] == \
        [(p, "fetched", len(archives[p])) for p in PARTS]
    for split, utts in (("dev-clean-2", 3), ("train-clean-5", 6)):
        scan = scan_split(out, split)
        assert len(scan.utterances) == utts and not scan.problems
        assert (out / split / MARKER).exists()
    assert (out / "README.TXT").exists()
    assert not any((out / WORKDIR).iterdir())  # archives deleted, no work folder left
    served, mtimes = len(openslr.log), {p: p.stat().st_mtime_ns for p in out.rglob("*.flac")}
    rows = fetch(openslr, out)
    assert [r["status"] for r in rows] == ["already fetched"] * 2
    assert len(openslr.log) == served  # nothing requested
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.flac")} == mtimes  # nothing re-extracted


def test_an_interrupted_download_resumes_where_it_stopped_without_fetching_a_byte_twice(openslr, archives, tmp_path):
    out, size = tmp_path / "corpus", len(archives["train-clean-5"])
    openslr.mode, openslr.cut = "close_mid", size // 3
    with pytest.raises(FetchError, match=r"closed the connection after \d+ of \d+ bytes.*short read.*kept in .*"
                                         r"run the same command again to resume"):
        fetch(openslr, out, parts=["train-clean-5"])
    part = out / WORKDIR / "train-clean-5.tar.gz.part"
    assert part.stat().st_size == size // 3 and not (out / "train-clean-5").exists()
    openslr.mode = "ok"
    rows = fetch(openslr, out, parts=["train-clean-5"])
    assert rows[0]["downloaded_bytes"] == size - size // 3
    assert openslr.log[-1][1:] == (size // 3, size - size // 3)  # Range from where it stopped
    assert openslr.sent("train-clean-5.tar.gz") == size  # every byte exactly once
    assert len(scan_split(out, "train-clean-5").utterances) == 6


def test_a_killed_fetch_resumes_from_its_partial_file(openslr, archives, tmp_path):
    """SIGKILL of the CLI mid-download (a throttled server), then the same command finishes it
    with one Range request from the partial file's size."""
    out, size = tmp_path / "corpus", len(archives["train-clean-5"])
    openslr.mode, openslr.rate = "throttle", size // 4  # ~4 s for the whole file
    cmd = [sys.executable, "-m", "speechperf", "corpus", "fetch", "mini-librispeech", str(out), "--parts",
           "train-clean-5", "--mirror", openslr.base, "--json"]
    proc = subprocess.Popen(cmd, env=os.environ.copy(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    part = out / WORKDIR / "train-clean-5.tar.gz.part"
    deadline = time.monotonic() + 60
    while not (part.exists() and part.stat().st_size > size // 8) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    kept = part.stat().st_size
    assert 0 < kept < size
    openslr.mode = "ok"
    rows = fetch(openslr, out, parts=["train-clean-5"])
    assert rows[0]["downloaded_bytes"] == size - kept
    # (the killed request's entry may come last: its thread logs once its writes fail)
    assert (kept, size - kept) in [(start, sent) for _, start, sent in openslr.log]
    assert len(scan_split(out, "train-clean-5").utterances) == 6


def test_a_server_that_ignores_range_restarts_the_file_cleanly(openslr, archives, tmp_path):
    out, data = tmp_path / "corpus", archives["dev-clean-2"]
    part = out / WORKDIR / "dev-clean-2.tar.gz.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"\0" * 1000)  # a prefix the server will not continue
    openslr.mode = "ignore_range"
    rows = fetch(openslr, out, parts=["dev-clean-2"])
    assert rows[0]["downloaded_bytes"] == len(data) and openslr.log[-1][1:] == (0, len(data))
    assert len(scan_split(out, "dev-clean-2").utterances) == 3


def test_a_tampered_archive_is_refused_deleted_and_nothing_looks_complete(openslr, archives, tmp_path):
    out, data = tmp_path / "corpus", bytearray(archives["dev-clean-2"])
    data[len(data) // 2] ^= 0xFF  # same size, one byte changed
    openslr.serve("dev-clean-2", bytes(data))
    with pytest.raises(FetchError, match=r"dev-clean-2.tar.gz: the downloaded dev-clean-2.tar.gz has md5 [0-9a-f]+, "
                                         r"not the published [0-9a-f]+; sha256 .*deleted .*download it anew"):
        fetch(openslr, out, parts=["dev-clean-2"])
    assert not (out / "dev-clean-2").exists()
    assert not list((out / WORKDIR).iterdir())  # neither the .part file nor an archive


def _unsafe(tmp_path, monkeypatch, openslr, member):
    """An archive with ``member`` added, its own checksums in the table: verification passes,
    extraction must refuse it."""
    data = make_archive("dev-clean-2", speakers=(84,), seed=1, extra=member)
    openslr.serve("dev-clean-2", data)
    monkeypatch.setenv(ENV, str(write_table(tmp_path, {"dev-clean-2": data})))
    out = tmp_path / "corpus"
    with pytest.raises(UnsafeArchive, match="refused member") as err:
        fetch(openslr, out)
    assert not (out / "dev-clean-2").exists() and not (out / WORKDIR / "dev-clean-2.extract").exists()
    return out, str(err.value)


def test_a_path_traversal_member_is_refused(openslr, tmp_path, monkeypatch, extraction):
    def member(tar):
        info = tarfile.TarInfo("LibriSpeech/../../escaped.txt")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    out, message = _unsafe(tmp_path, monkeypatch, openslr, member)
    assert "escaped.txt" in message
    assert not list(tmp_path.rglob("escaped.txt"))


def test_an_absolute_member_is_refused(openslr, tmp_path, monkeypatch):
    target = tmp_path / "absolute.txt"

    def member(tar):
        info = tarfile.TarInfo(str(target))
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    _unsafe(tmp_path, monkeypatch, openslr, member)
    assert not target.exists()


@pytest.fixture(params=["data filter", "without it"])
def extraction(request, monkeypatch):
    """Both ways of refusing: tarfile's data filter, and the checks for a Python without it."""
    from speechperf.corpus import archive

    if request.param == "without it":
        monkeypatch.setattr(archive, "HAS_DATA_FILTER", False)
    return request.param


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE])
def test_a_link_pointing_outside_is_refused(openslr, tmp_path, monkeypatch, kind, extraction):
    def member(tar):
        info = tarfile.TarInfo("LibriSpeech/dev-clean-2/84/100/link.flac")
        info.type, info.linkname = kind, "../../../../../../etc/passwd" if kind == tarfile.SYMTYPE else "/etc/passwd"
        tar.addfile(info)
    out, message = _unsafe(tmp_path, monkeypatch, openslr, member)
    print(message)


def _link(name, target, kind=tarfile.SYMTYPE):
    def member(tar):
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, target
        tar.addfile(info)
    return member


def test_a_relative_symlink_that_would_escape_out_once_renamed_is_refused(openslr, tmp_path, monkeypatch,
                                                                         extraction):
    """``updir -> ../..`` stays inside OUT/.fetch/dev-clean-2.extract while extracting (the data
    filter lets it through) and points at OUT's parent once the split is renamed to OUT/dev-clean-2."""
    (tmp_path / "secret").write_text("outside OUT")
    out, message = _unsafe(tmp_path, monkeypatch, openslr, _link("LibriSpeech/dev-clean-2/updir", "../.."))
    assert "dev-clean-2.tar.gz: refused member 'LibriSpeech/dev-clean-2/updir' (a symlink" in message
    assert not (out / "README.TXT").exists()  # refused before anything was moved into OUT


def test_a_flac_symlink_to_a_file_outside_out_is_refused(openslr, tmp_path, monkeypatch, extraction):
    (tmp_path / "secret").write_text("outside OUT")
    out, message = _unsafe(tmp_path, monkeypatch, openslr,
                           _link("LibriSpeech/dev-clean-2/84/100/84-100-0009.flac", "../../../../secret"))
    assert "'LibriSpeech/dev-clean-2/84/100/84-100-0009.flac' (a symlink" in message
    assert not list(out.rglob("84-100-0009.flac"))


def test_a_hardlink_to_a_missing_member_is_one_message_exit_2(openslr, tmp_path, monkeypatch, capsys, extraction):
    from speechperf.cli import main

    data = make_archive("dev-clean-2", speakers=(84,), seed=1, extra=_link(
        "LibriSpeech/dev-clean-2/84/100/x.flac", "LibriSpeech/dev-clean-2/84/100/missing.flac", tarfile.LNKTYPE))
    openslr.serve("dev-clean-2", data)
    monkeypatch.setenv(ENV, str(write_table(tmp_path, {"dev-clean-2": data})))
    out = tmp_path / "corpus"
    assert main(["corpus", "fetch", "mini-librispeech", str(out), "--mirror", openslr.base]) == 2
    err = capsys.readouterr().err.strip()  # the progress bars' lines, then the error's one line
    assert "Traceback" not in err and err.splitlines()[-1].startswith("speechperf: error: ")
    assert "dev-clean-2.tar.gz: refused member 'LibriSpeech/dev-clean-2/84/100/x.flac' (a hardlink" in \
        err.splitlines()[-1]
    assert not (out / "dev-clean-2").exists() and not (out / WORKDIR / "dev-clean-2.extract").exists()


def _file(name, data=b"x"):
    def member(tar):
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return member


@pytest.mark.parametrize("name", [".fetch", "LibriSpeech/.fetch", "LibriSpeech/.speechperf-fetch.json"])
def test_a_member_named_like_the_work_folder_is_refused_before_anything_moves_into_out(openslr, tmp_path,
                                                                                      monkeypatch, name):
    out, message = _unsafe(tmp_path, monkeypatch, openslr, _file(name))
    assert f"refused member {name!r} (not under LibriSpeech/dev-clean-2/" in message
    assert sorted(p.name for p in out.iterdir()) == [WORKDIR]  # no README.TXT moved in
    assert [p.name for p in (out / WORKDIR).iterdir()] == ["dev-clean-2.tar.gz"]  # the verified archive only


def _folder(name):
    def member(tar):
        info = tarfile.TarInfo(name)
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    return member


def _both(*makers):
    def member(tar):
        for make in makers:
            make(tar)
    return member


D = "LibriSpeech/dev-clean-2/84"
# issue 48: each was exit 1 with a traceback (IsADirectoryError, NotADirectoryError, ENAMETOOLONG,
# IsADirectoryError writing the marker); issue 61: a path past PATH_MAX (OSError ENAMETOOLONG)
ODD = {"a file, then a folder of its name": (_both(_file(f"{D}/x"), _folder(f"{D}/x")), f"'{D}/x' is a file earlier"),
       "a folder, then a file of its name": (_both(_folder(f"{D}/x"), _file(f"{D}/x")), f"'{D}/x' is a folder earlier"),
       "a file, then a member inside it": (_both(_file(f"{D}/x"), _file(f"{D}/x/y.flac")), f"'{D}/x' is a file earlier"),
       "a 300-character name": (_file(f"{D}/{'a' * 300}.flac"), "a name longer than 255 bytes"),
       "a path past PATH_MAX": (_file(f"{D}/{('b' * 200 + '/') * 21}x.flac"), "longer than the file system's PATH_MAX"),
       "a folder named like the marker": (_folder(f"LibriSpeech/dev-clean-2/{MARKER}"),
                                          f"named like corpus fetch's own completion marker {MARKER}")}


@pytest.mark.parametrize("odd", ODD)
def test_members_no_folder_can_hold_are_refused_by_name(openslr, tmp_path, monkeypatch, extraction, odd):
    member, says = ODD[odd]
    out, message = _unsafe(tmp_path, monkeypatch, openslr, member)
    assert says in message and "Traceback" not in message
    assert sorted(p.name for p in out.iterdir()) == [WORKDIR]  # nothing moved into OUT


def test_an_extraction_error_of_a_file_and_a_folder_is_still_one_message(openslr, tmp_path, monkeypatch):
    """The backstop where the names check lets one through: tarfile's own error, named."""
    from speechperf.corpus import archive

    monkeypatch.setattr(archive, "_check_kind", lambda *args: None)
    _, message = _unsafe(tmp_path, monkeypatch, openslr, ODD["a folder, then a file of its name"][0])
    assert f"{D}/x' (Is a directory)" in message


@pytest.mark.parametrize("name", ["LibriSpeech/train-clean-5", "LibriSpeech/train-clean-5/19/100/19-100-0000.flac"])
def test_a_member_of_another_split_is_refused_and_that_split_then_fetches(openslr, archives, tmp_path, monkeypatch,
                                                                          name):
    """A file named like a later part would be moved into OUT as a note, and that part then fail
    with "another fetch into OUT?"; a folder of another split would be left in the work folder."""
    bad = make_archive("dev-clean-2", speakers=(84,), seed=1, extra=_file(name))
    openslr.serve("dev-clean-2", bad)
    monkeypatch.setenv(ENV, str(write_table(tmp_path, {**archives, "dev-clean-2": bad})))
    out = tmp_path / "corpus"
    with pytest.raises(UnsafeArchive, match=f"refused member '{name}' \\(not under LibriSpeech/dev-clean-2/"):
        fetch(openslr, out, parts=["dev-clean-2"])
    assert sorted(p.name for p in out.iterdir()) == [WORKDIR]  # nothing stray in OUT
    rows = fetch(openslr, out, parts=["train-clean-5"])
    assert rows[0]["status"] == "fetched" and len(scan_split(out, "train-clean-5").utterances) == 6


def test_a_fifo_member_is_refused(openslr, tmp_path, monkeypatch, extraction):
    def member(tar):
        info = tarfile.TarInfo("LibriSpeech/dev-clean-2/fifo")
        info.type = tarfile.FIFOTYPE
        tar.addfile(info)
    _unsafe(tmp_path, monkeypatch, openslr, member)


def test_a_half_extracted_part_left_by_a_crash_is_redone(openslr, tmp_path):
    out = tmp_path / "corpus"
    leftover = out / WORKDIR / "dev-clean-2.extract" / "LibriSpeech" / "dev-clean-2" / "84"
    leftover.mkdir(parents=True)
    (leftover / "junk").write_text("from a killed run")
    fetch(openslr, out, parts=["dev-clean-2"])
    assert not (out / "dev-clean-2" / "84" / "junk").exists()
    assert len(scan_split(out, "dev-clean-2").utterances) == 3


def test_a_split_folder_not_made_by_fetch_is_refused(openslr, tmp_path):
    (tmp_path / "corpus" / "dev-clean-2").mkdir(parents=True)
    with pytest.raises(FetchError, match=r"dev-clean-2 exists but corpus fetch did not complete it.*move or delete"):
        fetch(openslr, tmp_path / "corpus")
    assert not openslr.log


def _refused_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("mode, pattern", [
    ("404", r"HTTP 404 .* while fetching dev-clean-2.tar.gz: no such file at this address; check --mirror"),
    ("500", r"HTTP 500 .* while fetching dev-clean-2.tar.gz: the server failed; run the same command again later"),
    ("slow", r"no data for 0.5 s while fetching dev-clean-2.tar.gz \(0 of \d+ bytes\); run the same command again"),
    ("redirect_loop", r"the server redirects in a loop \(or more than 10 times; last HTTP 302\) while fetching "
                      r"dev-clean-2.tar.gz; check the address"),
    ("refused", r"cannot connect \(.*Connection refused.*\) while fetching dev-clean-2.tar.gz; run the same command"),
])
def test_every_network_failure_is_one_message_naming_the_url_the_file_and_what_to_do(openslr, tmp_path, mode,
                                                                                     pattern):
    openslr.mode, openslr.delay = mode, 3.0
    base = f"http://127.0.0.1:{_refused_port()}/resources" if mode == "refused" else openslr.base
    with pytest.raises(FetchError, match=pattern) as err:
        fetch_corpus("mini-librispeech", tmp_path / "corpus", parts=["dev-clean-2"], mirror=base, timeout=0.5,
                     progress=False)
    assert f"{base}/31/dev-clean-2.tar.gz" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "corpus" / "dev-clean-2").exists()


def test_a_part_without_a_published_checksum_is_refused_before_any_download(openslr, archives, tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(write_table(tmp_path, archives, skip=("train-clean-5",))))
    with pytest.raises(FetchError, match=r"refusing to fetch train-clean-5 \(no published size\).*add them there"):
        fetch(openslr, tmp_path / "corpus")
    assert not openslr.log


def test_unknown_parts_and_a_disk_too_small_are_refused_by_name(openslr, tmp_path, monkeypatch):
    with pytest.raises(FetchError, match=r"mini-librispeech has no part dev-clean: its parts are dev-clean-2, "
                                         r"train-clean-5"):
        fetch(openslr, tmp_path / "corpus", parts=["dev-clean"])
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**12, 10**12 - 1000, 1000))
    with pytest.raises(FetchError, match=r"has 0.0 GB free; fetching dev-clean-2, train-clean-5 needs about"):
        fetch(openslr, tmp_path / "corpus")
    assert not openslr.log


def test_the_cli_prints_one_line_and_exits_2_on_a_failure(openslr, tmp_path, capsys):
    from speechperf.cli import main

    openslr.mode = "404"
    assert main(["corpus", "fetch", "mini-librispeech", str(tmp_path / "c"), "--mirror", openslr.base]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("speechperf: error: http://127.0.0.1:") and "HTTP 404" in err and "\n" not in err


@pytest.mark.slow
def test_fetch_mini_librispeech_then_prepare_then_train_end_to_end(tmp_path, monkeypatch, capsys):
    """The Done-when chain through the real CLI: `corpus fetch mini-librispeech OUT --mirror
    LOOPBACK`, `prepare OUT FEATS`, `train --preset tiny --data FEATS` (one epoch; the small
    made-up archives hold 12 training utterances, fewer than the cpu preset's batch of 24).
    Mini LibriSpeech's validation split is dev-clean-2: train.eval.split names it."""
    import json

    from speechperf.cli import main

    archives = {"dev-clean-2": make_archive("dev-clean-2", speakers=(84, 85), utterances=3, seed=1),
                "train-clean-5": make_archive("train-clean-5", speakers=(19, 26, 27), utterances=4, seed=2)}
    srv = Loopback()
    try:
        for name, data in archives.items():
            srv.serve(name, data)
        monkeypatch.setenv(ENV, str(write_table(tmp_path, archives)))
        corpus, feats, run = tmp_path / "OUT", tmp_path / "FEATS", tmp_path / "RUN"
        assert main(["corpus", "fetch", "mini-librispeech", str(corpus), "--mirror", srv.base, "--json"]) == 0
        fetched = json.loads(capsys.readouterr().out)
        assert [(r["part"], r["status"]) for r in fetched] == [("dev-clean-2", "fetched"), ("train-clean-5", "fetched")]
        assert main(["prepare", str(corpus), str(feats), "--workers", "1", "--json"]) == 0
        prepared = {r["split"]: r["kept"] for r in json.loads(capsys.readouterr().out)}
        assert prepared == {"dev-clean-2": 6, "train-clean-5": 12}
        assert main(["train", "--preset", "tiny", "--data", str(feats), "--out", str(run), "--json",
                     "train.stop.max_epochs=1"]) == 2  # no dev-clean: refused before the clock, naming the way out
        err = capsys.readouterr().err
        assert "validation split 'dev-clean'" in err and "prepared: dev-clean-2, train-clean-5" in err
        assert "train.eval.split=NAME" in err and not run.exists()
        assert main(["train", "--preset", "tiny", "--data", str(feats), "--out", str(run), "--json",
                     "train.stop.max_epochs=1", "train.eval.split=dev-clean-2"]) == 0
    finally:
        srv.close()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "success" and summary["epochs"] == 1 and summary["iterations"] == 3  # 12 / 4
    assert json.loads((feats / "stats.json").read_text())["splits"] == ["train-clean-5"]
