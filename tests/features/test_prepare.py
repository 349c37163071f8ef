import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from speechperf.errors import SpeechperfError
from speechperf.features.feature_config import FeatureConfig
from speechperf.features.prepare import prepare
from speechperf.features.shards import ShardError, load_index, read_shard, write_shard
from tests.conftest import prepared_files


def test_shard_round_trip_and_checksum(tmp_path):
    feats = [np.random.default_rng(i).standard_normal((20 + i, 93)).astype(np.float32) * 30 for i in range(3)]
    sha = write_shard(tmp_path / "s.npz", feats, ["a", "b", "c"], ["x", "y y", "z"], [0.2, 0.21, 0.22])
    got = read_shard(tmp_path / "s.npz", sha)
    assert list(got) == ["a", "b", "c"] and got["b"][1] == "y y"
    for f, key in zip(feats, "abc"):
        assert np.allclose(got[key][0], f, rtol=1e-3, atol=0.05)  # float16 storage
    data = (tmp_path / "s.npz").read_bytes()
    (tmp_path / "s.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ShardError, match="checksum"):
        read_shard(tmp_path / "s.npz", sha)
    with pytest.raises(ShardError, match="cannot be read"):
        read_shard(tmp_path / "s.npz")


def test_prepare_reports_every_bad_file_and_keeps_the_rest(bad_corpus, tmp_path):
    out = tmp_path / "feats"
    (row,) = prepare(bad_corpus, out, workers=1, progress=False)["splits"]
    assert row["kept"] == 3
    index = load_index(out / "train-clean")
    kinds = {p["kind"]: p["path"] for p in index["problems"]}
    expected = {"sample_rate": "0003", "unreadable_audio": None, "too_short": "0010", "too_long": "0011",
                "missing_audio": None, "missing_transcript": "0007", "alphabet": "0008", "empty_transcript": "0009",
                "malformed_line": None}
    assert set(kinds) == set(expected)
    for kind, uid in expected.items():
        if uid:
            assert kinds[kind].endswith(f"19-198-{uid}.flac"), kind
    assert {p["path"][-9:-5] for p in index["problems"] if p["kind"] == "unreadable_audio"} == {"0004", "0005"}
    summary = json.loads((out / "prepare.json").read_text())
    assert summary["splits"][0]["kept"] == 3
    stats = json.loads((out / "stats.json").read_text())
    assert len(stats["mean"]) == 93 and min(stats["std"]) > 0
    rec = index["utterances"][1]
    assert rec["transcript"] == "a cool dog's bone" and rec["frames"] == 1 + int(1.2 * 16000) // 160


def test_rerun_is_noop_and_config_mismatch_is_refused(bad_corpus, tmp_path):
    out = tmp_path / "feats"
    prepare(bad_corpus, out, workers=1, progress=False)
    mtime = (out / "train-clean" / "index.json").stat().st_mtime_ns
    prepare(bad_corpus, out, workers=1, progress=False)
    assert (out / "train-clean" / "index.json").stat().st_mtime_ns == mtime
    with pytest.raises(SpeechperfError, match="another FeatureConfig"):
        prepare(bad_corpus, out, workers=1, progress=False, config=FeatureConfig(n_mels=40))


def test_killed_prepare_resumes_to_the_same_result(tiny_corpus, tiny_features, tmp_path):
    out = tmp_path / "feats"
    p = subprocess.Popen([sys.executable, "-m", "speechperf", "prepare", str(tiny_corpus), str(out), "--workers", "1",
                          "--splits", "train-clean"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not list((out / "train-clean").glob("shard-*.json")):
        time.sleep(0.02)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    # The tiny train-clean is one shard: its index follows its sidecar within milliseconds (the
    # pool now lives until every split is done), so the kill may land after it. Removing it
    # leaves what a kill between the last sidecar and the index leaves; test_prepare_kill.py
    # kills mid-split, after k of several shards.
    (out / "train-clean" / "index.json").unlink(missing_ok=True)
    done = {f.name: f.stat().st_mtime_ns for f in (out / "train-clean").glob("shard-*.json")}
    assert done
    prepare(tiny_corpus, out, splits=["train-clean"], workers=1, progress=False)
    for name, mtime in done.items():  # finished shards were kept, not redone
        assert (out / "train-clean" / name).stat().st_mtime_ns == mtime
    a = load_index(out / "train-clean")
    b = load_index(tiny_features / "train-clean")
    assert a["utterances"] == b["utterances"] and a["shards"] == b["shards"]


def test_a_killed_writes_temporary_beside_stats_json_is_removed(tiny_corpus, tiny_features, tmp_path):
    """A SIGKILL inside stats.json's atomic write leaves its temporary in the folder's top (the
    chain of kills below found one); the next prepare removes it, as it does a split's."""
    import shutil

    out = shutil.copytree(tiny_features, tmp_path / "feats")
    (out / ".stats.json.90rd1p5g.tmp").write_bytes(b"half a file")
    prepare(tiny_corpus, out, workers=1, progress=False)
    assert not list(out.glob(".*.tmp")) and sorted(prepared_files(out)) == sorted(prepared_files(tiny_features))


def test_shards_are_byte_deterministic(tmp_path, monkeypatch):
    feats = [np.arange(40 * 93, dtype=np.float32).reshape(40, 93) / 7]
    a = write_shard(tmp_path / "a.npz", feats, ["u"], ["hi"], [0.4])
    later = time.time() + 3600
    monkeypatch.setattr(time, "time", lambda: later)  # an hour on: a time-stamped zip entry would differ
    b = write_shard(tmp_path / "b.npz", feats, ["u"], ["hi"], [0.4])
    assert a == b and (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()


def test_prepare_rebuilds_a_corrupt_shard_identical_and_the_loader_names_the_repair(tiny_corpus, tiny_features,
                                                                                    tmp_path, capsys):
    from speechperf.data.loader_config import LoaderConfig
    from speechperf.data.loader import make_loader

    out = tmp_path / "feats"
    shutil.copytree(tiny_features, out)
    shard = out / "train-clean" / "shard-00000.npz"
    original = shard.read_bytes()
    data = bytearray(original)
    data[len(data) // 2] ^= 0x40  # one flipped bit inside the deflated frames
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardError) as e:
        for _ in make_loader(out, ["train-clean"], LoaderConfig(readers=0), epoch=1, seed=1):
            pass
    assert f"speechperf prepare {tiny_corpus} {out} --splits train-clean" in str(e.value)
    untouched = {p: p.stat().st_mtime_ns for p in out.glob("*/*") if p.parent.name != "train-clean"}
    prepare(tiny_corpus, out, workers=1, progress=False)
    assert f"{shard} is missing or does not match its checksum; rebuilding it" in capsys.readouterr().err
    assert shard.read_bytes() == original  # rebuilt, byte for byte
    assert load_index(out / "train-clean") == load_index(tiny_features / "train-clean")
    assert {p: p.stat().st_mtime_ns for p in untouched} == untouched  # the intact splits were only read
    assert json.loads((out / "prepare.json").read_text())["rebuilt"] == {"train-clean": [str(shard)]}
    (out / "train-clean" / "index.json").write_text("{trunc")  # an unreadable index is rebuilt from the sidecars
    prepare(tiny_corpus, out, splits=["train-clean"], workers=1, progress=False)
    assert load_index(out / "train-clean") == load_index(tiny_features / "train-clean")


def test_cli_prepare_repairs_a_corrupt_shard(tiny_corpus, tiny_features, tmp_path):
    out = tmp_path / "feats"
    shutil.copytree(tiny_features, out)
    shard = out / "dev-clean" / "shard-00000.npz"
    original = shard.read_bytes()
    shard.write_bytes(original[:-10])
    p = subprocess.run([sys.executable, "-m", "speechperf", "prepare", str(tiny_corpus), str(out), "--workers", "1",
                        "--json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert str(shard) in p.stderr and shard.read_bytes() == original


@pytest.mark.timeout(600)
def test_a_chain_of_sigkills_then_prepare_is_byte_identical(tiny_corpus, tiny_features, tmp_path):
    """Killed at seeded random moments, again and again: the finished folder equals an
    uninterrupted prepare byte for byte (prepare.json aside: it records the seconds taken)."""
    out, rng, kills = tmp_path / "feats", random.Random(8), 0
    cmd = [sys.executable, "-m", "speechperf", "prepare", str(tiny_corpus), str(out), "--workers", "1", "--json"]
    def written():
        return len(list(out.glob("*/*"))) if out.exists() else 0

    for _ in range(4):
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        files, deadline = written(), time.time() + 120
        while time.time() < deadline and p.poll() is None and written() <= files:
            time.sleep(0.01)  # until this run has written something
        # within 0.1 s of its first write: an idle machine finished the tiny corpus's remaining
        # shards inside a longer pause, leaving fewer than three runs to kill
        time.sleep(rng.random() * 0.1)
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            kills += 1
        p.wait()
    assert kills >= 3
    prepare(tiny_corpus, out, workers=1, progress=False)
    want, got = prepared_files(tiny_features), prepared_files(out)
    assert sorted(got) == sorted(want)
    assert [k for k in want if got[k] != want[k] and k != Path("prepare.json")] == []
    a, b = (json.loads(x.pop(Path("prepare.json"))) for x in (got, want))
    assert {**a, "seconds": 0} == {**b, "seconds": 0}


def test_raw_shards_hold_the_same_batches_and_a_folder_keeps_its_form(tiny_corpus, tiny_features, tmp_path):
    """prepare --raw stores the shards' arrays uncompressed (zip members stored, not deflated):
    the loader builds bit-identical batches from them; the folder keeps the form it was made
    with, and a folder made before the field existed reads as deflated."""
    import dataclasses
    import zipfile

    import torch

    from speechperf.config import load_preset
    from speechperf.data.loader import make_loader

    raw = tmp_path / "raw"
    p = subprocess.run([sys.executable, "-m", "speechperf", "prepare", str(tiny_corpus), str(raw), "--raw",
                        "--workers", "1", "--splits", "train-clean", "--json"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    shard = next((raw / "train-clean").glob("shard-*.npz"))
    assert {i.compress_type for i in zipfile.ZipFile(shard).infolist()} == {zipfile.ZIP_STORED}
    deflated = tiny_features / "train-clean" / shard.name
    assert {i.compress_type for i in zipfile.ZipFile(deflated).infolist()} == {zipfile.ZIP_DEFLATED}
    assert shard.stat().st_size > deflated.stat().st_size
    assert json.loads((raw / "features.json").read_text())["compress"] is False
    cfg = dataclasses.replace(load_preset("tiny").loader, normalize=False)  # stats.json: here over train-clean only
    for a, b in zip(make_loader(tiny_features, ["train-clean"], cfg, 2, 1),
                    make_loader(raw, ["train-clean"], cfg, 2, 1), strict=True):
        assert a.ids == b.ids and torch.equal(a.feats, b.feats) and torch.equal(a.labels, b.labels)
    with pytest.raises(SpeechperfError, match="another FeatureConfig"):  # a deflated folder stays deflated
        prepare(tiny_corpus, raw, splits=["train-clean"], workers=1, progress=False)
    old = tmp_path / "old"  # features.json as written before the field: no "compress" key
    shutil.copytree(tiny_features, old)
    cfg_json = json.loads((old / "features.json").read_text())
    cfg_json.pop("compress", None)
    (old / "features.json").write_text(json.dumps(cfg_json))
    prepare(tiny_corpus, old, workers=1, progress=False)  # accepted: the default (deflated) is what it holds


def test_index_sums_are_those_of_the_stored_float16_values(tiny_features):
    """The sums in a shard's sidecar (and so in index.json and the features checksum) are the
    float16 values as stored: a float32 value moved by one ulp that float16 rounds away leaves
    them as they are."""
    split = tiny_features / "train-clean"
    side = json.loads((split / "shard-00000.json").read_text())
    with np.load(split / "shard-00000.npz") as z:
        stored = z["feats"]
    assert stored.dtype == np.float16 and not np.signbit(stored[stored == 0]).any()
    as64 = stored.astype(np.float64)
    assert side["sums"]["n"] == len(stored)
    assert side["sums"]["sum"] == as64.sum(0).tolist() and side["sums"]["sumsq"] == (as64**2).sum(0).tolist()


def test_features_json_records_what_made_them(tiny_features):
    import torch

    made = json.loads((tiny_features / "features.json").read_text())["made_with"]
    assert made["precision"] == "float64" and made["torch"] == torch.__version__ and made["numpy"] == np.__version__
    assert made["cap"] == {} and (made["mkl"] is not None) == torch.backends.mkl.is_available()


def test_as_stored_has_one_zero():
    """float16 rounds the DCT's +-1e-14 rounding noise (an MFCC that is exactly zero) to +0 or
    -0 by its sign; stored, both are +0, so the bytes do not depend on the kernel's sums."""
    from speechperf.features.shards import as_stored

    got = as_stored(np.array([-1e-14, 1e-14, -0.0, -1.5], dtype=np.float32))
    assert got.dtype == np.float16 and got.view(np.uint16).tolist() == [0, 0, 0, np.float16(-1.5).view(np.uint16)]
