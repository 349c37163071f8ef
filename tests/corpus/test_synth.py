import re
import shutil

import numpy as np
import soundfile as sf

from speechperf.corpus.sentences import SentenceGenerator, vocabulary
from speechperf.corpus.synth import SPLITS, plan, speakers, synthesize
from speechperf.corpus.alphabet import normalize
from tests.conftest import TINY_HOURS, TINY_SEED


def test_vocabulary_and_sentences():
    vocab = vocabulary()
    assert len(vocab) >= 2000
    assert all(normalize(w) == w for w in vocab)
    g = SentenceGenerator(7)
    sents = [g.sentence() for _ in range(300)]
    assert all(3 <= len(s.split()) <= 30 for s in sents)
    assert all(set(s.split()) <= vocab for s in sents)
    assert any("'" in s for s in sents)  # contractions exercise the apostrophe
    assert sents == [SentenceGenerator(7).sentence() for _ in range(1)] + sents[1:]
    assert SentenceGenerator(8).sentence() != sents[0]


def test_speakers_disjoint_across_splits():
    spk = speakers(1)
    voices = [v for split in SPLITS for _, v in spk[split]]
    assert len(voices) == len(set(voices))
    train = {(v.voice, v.variant) for _, v in spk["train-clean"] + spk["train-other"]}
    assert not train & {(v.voice, v.variant) for _, v in spk["dev-clean"]}


def test_layout_and_transcripts(tiny_corpus):
    rows = synthesize(tiny_corpus, hours=0.03, seed=3, progress=False)["splits"]  # cached: a no-op
    assert [r["split"] for r in rows] == list(SPLITS)
    for split in SPLITS:
        trans = sorted((tiny_corpus / split).glob("*/*/*.trans.txt"))
        assert trans
        for t in trans:
            speaker, chapter = t.parent.parent.name, t.parent.name
            assert t.name == f"{speaker}-{chapter}.trans.txt"
            for line in t.read_text().splitlines():
                uid, text = line.split(" ", 1)
                assert re.fullmatch(rf"{speaker}-{chapter}-\d{{4}}", uid) and text == text.upper()
                audio, rate = sf.read(t.parent / f"{uid}.flac")
                assert rate == 16000 and 1.0 <= len(audio) / rate <= 15.0


def test_deterministic_for_a_seed_whatever_the_worker_count(tiny_corpus, tmp_path):
    """Speakers made again one at a time equal the session's corpus (synthesized with workers=0,
    every core): a speaker's audio depends on the seed alone, not on the pool or the order of its
    jobs. Three speakers, one of each kind (the first training speaker, a noisy one, one of the
    last split's), stand for all 13: the whole corpus again took 22 s of a 2-core test run."""
    a, b = tmp_path / "a", tiny_corpus
    shutil.copytree(b, a)
    (a / "SYNTH.json").unlink()
    jobs = plan(a, TINY_HOURS, TINY_SEED)
    again = [jobs[0], next(j for j in jobs if j.noisy and j.split.startswith("train")), jobs[-1]]
    for j in again:
        shutil.rmtree(a / j.split / str(j.speaker))
    synthesize(a, hours=TINY_HOURS, seed=TINY_SEED, progress=False, workers=1)
    remade = sorted(p.relative_to(a) for j in again for p in (a / j.split / str(j.speaker)).rglob("*.flac"))
    assert len({r.parts[:2] for r in remade}) == 3
    assert sorted(p.relative_to(a) for p in a.rglob("*.flac")) == sorted(p.relative_to(b) for p in b.rglob("*.flac"))
    for rel in remade:
        assert np.array_equal(sf.read(a / rel)[0], sf.read(b / rel)[0]), rel
    # another seed draws other voices and other sentences (checked on the draws, not a third corpus)
    assert speakers(TINY_SEED + 1) != speakers(TINY_SEED)
    first = [SentenceGenerator(seed=s * 100_003 + 1000).sentence() for s in (TINY_SEED, TINY_SEED + 1)]
    assert first[0] != first[1]


def test_rerun_is_a_noop_and_partial_runs_complete(tiny_corpus, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(tiny_corpus, root)  # a finished corpus (the session's is only read)
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*.flac")}
    # simulate an interruption: one speaker unfinished, the completion marker gone
    (root / "SYNTH.json").unlink()
    victim = next((root / "dev-clean").glob("*/.done"))
    victim.unlink()
    chapter = next(p for p in victim.parent.iterdir() if p.is_dir())
    stale = chapter / f".{next(chapter.glob('*.flac')).name}.k1ll3d.tmp"  # a kill inside a flac's atomic write
    stale.write_bytes(b"half a flac")
    synthesize(root, hours=TINY_HOURS, seed=TINY_SEED, progress=False)
    assert not stale.exists()  # the unfinished speaker's job removed it before writing again
    after = {p: p.stat().st_mtime_ns for p in root.rglob("*.flac")}
    assert set(after) == set(before)
    changed = {p for p in after if after[p] != before[p]}
    assert changed and all(victim.parent in p.parents for p in changed)
    synthesize(root, hours=TINY_HOURS, seed=TINY_SEED, progress=False)
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*.flac")} == after
