"""``speechperf prepare FEATS --manifest SPLIT=PATH``: the tiny corpus described by lhotse
manifests (written with lhotse's own API) prepares to the LibriSpeech layout's features, byte for
byte; bad manifests are one line and exit 2."""
import json
from pathlib import Path

import pytest
from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet

from speechperf.corpus.librispeech import find_splits, scan_split
from speechperf.features.shards import load_index, repair_command
from tests.conftest import cli


def _manifests(corpus, split):
    """The split's RecordingSet and SupervisionSet, one recording per file, in the scan's order;
    the transcripts upper case, as LibriSpeech's (prepare normalizes them)."""
    recs, sups = [], []
    for u in scan_split(corpus, split).utterances:
        rec = Recording.from_file(u.audio_path, recording_id=u.id)
        recs.append(rec)
        sups.append(SupervisionSegment(u.id, u.id, start=0.0, duration=rec.duration, text=u.transcript.upper(),
                                       speaker=u.speaker))
    return RecordingSet.from_recordings(recs), SupervisionSet.from_segments(sups)


def _write_manifests(corpus, folder) -> list[str]:
    """--manifest arguments: the training split as a CutSet (ids those of the files), the others
    as a RecordingSet and a SupervisionSet."""
    args = []
    for split in find_splits(corpus):
        recs, sups = _manifests(corpus, split)
        if split.startswith("train"):
            cuts = CutSet.from_manifests(recs, sups).modify_ids(lambda cid: cid.rsplit("-", 1)[0])  # drop "-0"
            cuts.to_file(folder / f"cuts_{split}.jsonl.gz")
            args += ["--manifest", f"{split}={folder / f'cuts_{split}.jsonl.gz'}"]
        else:
            recs.to_file(folder / f"recordings_{split}.jsonl")
            sups.to_file(folder / f"supervisions_{split}.jsonl.gz")
            args += ["--manifest", f"{split}={folder / f'recordings_{split}.jsonl'}",
                     "--manifest", f"{split}={folder / f'supervisions_{split}.jsonl.gz'}"]
    return args


def test_manifests_prepare_the_librispeech_layouts_features_byte_for_byte(tiny_corpus, tiny_features, tmp_path):
    args = _write_manifests(tiny_corpus, tmp_path)
    out = tmp_path / "feats"
    p = cli("prepare", out, *args, "--workers", "1", "--json", check=True)
    rows = {r["split"]: r for r in json.loads(p.stdout)}
    splits = find_splits(tiny_corpus)
    assert sorted(rows) == splits and all(r["kept"] > 0 and r["dropped"] == 0 for r in rows.values())
    for split in splits:
        names = sorted(f.name for f in (tiny_features / split).iterdir())
        assert sorted(f.name for f in (out / split).iterdir()) == names
        for name in names:  # shards, their sidecars and the index
            assert (out / split / name).read_bytes() == (tiny_features / split / name).read_bytes(), f"{split}/{name}"
    for name in ("stats.json", "features.json"):
        assert (out / name).read_bytes() == (tiny_features / name).read_bytes()
    recorded = json.loads((out / "prepare.json").read_text())
    assert recorded["corpus"] is None and recorded["manifests"]["dev-clean"][1].endswith("supervisions_dev-clean.jsonl.gz")
    # a damaged split's repair command names its manifests
    assert repair_command(out / "dev-clean") == (f"speechperf prepare {out} "
                                                 f"--manifest dev-clean={tmp_path / 'recordings_dev-clean.jsonl'} "
                                                 f"--manifest dev-clean={tmp_path / 'supervisions_dev-clean.jsonl.gz'}")
    (out / "dev-clean" / "index.json").unlink()
    with pytest.raises(Exception, match="--manifest dev-clean="):
        load_index(out / "dev-clean")


def test_a_bad_manifest_is_one_line_exit_2_naming_file_and_cut(tiny_corpus, tmp_path):
    recs, sups = _manifests(tiny_corpus, "dev-clean")
    cuts = CutSet.from_manifests(recs, sups)
    bad = next(iter(cuts))
    bad.supervisions[0].text = None
    CutSet.from_cuts([bad, *list(cuts)[1:]]).to_file(tmp_path / "cuts.jsonl.gz")
    out = tmp_path / "feats"
    p = cli("prepare", out, "--manifest", f"dev-clean={tmp_path / 'cuts.jsonl.gz'}")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert f"{tmp_path / 'cuts.jsonl.gz'}: cut {bad.id}: supervision" in p.stderr and "has no text" in p.stderr
    p = cli("prepare", out, "--manifest", f"dev-clean={tmp_path / 'cuts.json'}")
    assert p.returncode == 2 and "does not exist" in p.stderr and "cuts.json" in p.stderr
    p = cli("prepare", tiny_corpus, out, "--manifest", f"dev-clean={tmp_path / 'cuts.jsonl.gz'}")
    assert p.returncode == 2 and "not both" in p.stderr
    assert not out.exists()  # refused before anything was written


def test_the_manifests_of_lhotses_librispeech_recipe_prepare_the_layouts_features(tiny_corpus, tiny_features,
                                                                                   tmp_path):
    """lhotse's own recipe (``prepare_librispeech``, then ``CutSet.from_manifests``) names cut k
    ``UTTERANCE-k`` and lists chapters in the file system's order: the same features folder as the
    layout's all the same (issue 61: the ids kept ``-0``, ``-1``..., the training shards another order)."""
    from lhotse.recipes import prepare_librispeech

    from speechperf.features.prepare import prepare
    from tests.conftest import prepared_files

    splits = find_splits(tiny_corpus)
    made = prepare_librispeech(tiny_corpus, dataset_parts=splits, output_dir=tmp_path / "manifests", num_jobs=1)
    pairs = []
    for split in splits:
        cuts = CutSet.from_manifests(recordings=made[split]["recordings"], supervisions=made[split]["supervisions"])
        assert next(iter(cuts)).id.endswith("-0")  # the counter this test is about
        cuts.to_file(tmp_path / f"cuts_{split}.jsonl.gz")
        pairs.append((split, tmp_path / f"cuts_{split}.jsonl.gz"))
    prepare(None, tmp_path / "feats", workers=1, progress=False, manifests=pairs)
    ours, layout = prepared_files(tmp_path / "feats"), prepared_files(tiny_features)
    ours.pop(Path("prepare.json"))  # it names the manifests it was made from
    layout.pop(Path("prepare.json"))
    assert sorted(ours) == sorted(layout)
    assert [name for name in ours if ours[name] != layout[name]] == []  # shards, sidecars, indexes, stats: byte for byte
