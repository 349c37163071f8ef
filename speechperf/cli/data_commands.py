"""Commands that make a corpus and its features: ``corpus synth|fetch|check``, ``prepare`` and
``lm build``; each one's arguments declared right above it."""
from __future__ import annotations

import argparse
from pathlib import Path

from speechperf.cli.parsing import Command, csv_list, width
from speechperf.corpus import synth  # synth.synthesize looked up when called
from speechperf.corpus.librispeech import check_corpus
from speechperf.features.feature_config import FeatureConfig
from speechperf.features.prepare import prepare
from speechperf.tables import emit


def _corpus_synth_args(sp) -> None:
    sp.add_argument("out")
    sp.add_argument("--hours", type=float, default=1.5, help="hours of training audio")
    sp.add_argument("--seed", type=int, default=1)


def cmd_corpus_synth(a) -> int:
    summary = synth.synthesize(Path(a.out), hours=a.hours, seed=a.seed, progress=not a.json)
    emit(summary["splits"], a.json, width=width(a))
    return 0


def _corpus_check_args(sp) -> None:
    sp.add_argument("corpus")
    sp.add_argument("--splits", type=csv_list(), default=None)


def cmd_corpus_check(a) -> int:
    rows = check_corpus(Path(a.corpus), splits=a.splits)
    emit(rows, a.json, width=width(a))
    return 0


def _corpus_fetch_args(sp) -> None:
    sp.add_argument("corpus", choices=["librispeech", "mini-librispeech"])
    sp.add_argument("out", help="corpus folder: OUT/SPLIT/SPEAKER/CHAPTER/*.flac, for speechperf prepare OUT FEATS")
    sp.add_argument("--parts", type=csv_list(), default=None,
                    help="parts (splits) to fetch, e.g. dev-clean,train-clean-100 (default: all of the corpus)")
    sp.add_argument("--mirror", default=None, metavar="URL",
                    help="replaces the base address https://www.openslr.org/resources, "
                         "e.g. --mirror https://us.openslr.org/resources")
    sp.add_argument("--keep-archives", action="store_true", help="keep OUT/.fetch/PART.tar.gz after extraction")
    sp.add_argument("--timeout", type=float, default=60.0, help="seconds without data before a download fails")


def cmd_corpus_fetch(a) -> int:
    from speechperf.corpus.fetch import fetch_corpus  # ssl, http, tarfile: the download command's only

    rows = fetch_corpus(a.corpus, Path(a.out), parts=a.parts, mirror=a.mirror, keep_archives=a.keep_archives,
                        timeout=a.timeout, progress=not a.json)
    emit(rows, a.json, width=width(a))
    return 0


def _split_manifest(text: str) -> tuple[str, Path]:
    """``SPLIT=PATH`` of ``--manifest``."""
    split, sep, path = text.partition("=")
    if not sep or not split or not path:
        raise argparse.ArgumentTypeError(f"{text!r} is not SPLIT=PATH (e.g. train=cuts_train.jsonl.gz)")
    return split, Path(path)


def _prepare_args(sp) -> None:
    sp.add_argument("corpus", nargs="?", default=None,
                    help="corpus folder in the LibriSpeech layout (leave it out with --manifest)")
    sp.add_argument("out", metavar="feats", help="features folder to write")
    sp.add_argument("--splits", type=csv_list(), default=None, help="splits to prepare (default: all found)")
    sp.add_argument("--manifest", action="append", type=_split_manifest, default=None, metavar="SPLIT=PATH",
                    help="a lhotse manifest (.jsonl or .jsonl.gz) of split SPLIT, instead of CORPUS: a CutSet, or a "
                         "RecordingSet and a SupervisionSet (the option twice); repeat per split. Name the splits "
                         "as training reads them: train* (trained together), dev-clean (validation), test-clean. "
                         "Needs the lhotse extra")
    sp.add_argument("--workers", type=int, default=0, help="CPU worker processes (0: one per core)")
    sp.add_argument("--raw", action="store_true",
                    help="store the shards' arrays uncompressed: 1.2x the disk, about half a loader reader's CPU "
                         "(for GPU hosts whose readers cannot keep up; a folder keeps the form it was made with)")
    sp.add_argument("--recompute-stats", action="store_true",
                    help="compute stats.json again over every prepared train-* split (needed to add a training "
                         "split; runs trained on the previous statistics then refuse to continue); without it "
                         "stats.json is never changed")
    sp.add_argument("--units", type=csv_list(), default=[], metavar="SPEC[,SPEC]",
                    help="also train output units: bpe:N, a SentencePiece BPE model of N pieces trained from the "
                         "training splits' transcripts, into FEATS/units/bpe-N.model (a run asking for units the "
                         "folder lacks trains them at its start instead)")


def cmd_prepare(a) -> int:
    from speechperf.data.units import parse_spec, prepare_units  # torch and sentencepiece: this command's only

    for spec in a.units:
        parse_spec(spec, "--units")  # a bad spec is refused before any work
    summary = prepare(a.corpus and Path(a.corpus), Path(a.out), splits=a.splits, workers=a.workers, progress=not a.json,
                      recompute_stats=a.recompute_stats, config=FeatureConfig(compress=not a.raw), manifests=a.manifest)
    prepare_units(Path(a.out), a.units, quiet=a.json)
    emit(summary["splits"], a.json, width=width(a))
    return 0


def _lm_build_args(sp) -> None:
    sp.add_argument("features")
    sp.add_argument("--split", default=None, help="training split(s) whose text is used (default: all train-*)")


def cmd_lm_build(a) -> int:
    from speechperf.data.lm import build_lm_for_features  # torch: this command's only

    emit([build_lm_for_features(Path(a.features), split=a.split)], a.json, width=width(a))
    return 0


GROUPS = {"corpus": "corpora: synthesize the embedded one, fetch LibriSpeech, check one",
          "lm": "dictionary and language model"}
COMMANDS = [
    Command("synth", "synthesize the embedded English corpus in LibriSpeech layout", cmd_corpus_synth,
            _corpus_synth_args, group="corpus"),
    Command("fetch", "download and unpack LibriSpeech (OpenSLR 12) or Mini LibriSpeech (OpenSLR 31), resumable, "
            "every archive verified against the published size and checksums", cmd_corpus_fetch, _corpus_fetch_args,
            group="corpus"),
    Command("check", "scan a LibriSpeech-layout corpus and report problems", cmd_corpus_check, _corpus_check_args,
            group="corpus"),
    Command("prepare", "extract 93-dim features into compressed shards", cmd_prepare, _prepare_args),
    Command("build", "build the dictionary and bigram LM of a prepared dataset", cmd_lm_build, _lm_build_args,
            group="lm"),
]
