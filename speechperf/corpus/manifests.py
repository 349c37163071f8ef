"""Corpora described by lhotse manifests (the format of lhotse's recipes, icefall and NeMo):
``speechperf prepare FEATS --manifest SPLIT=PATH``.

A split is one CutSet, or one RecordingSet with one SupervisionSet (JSON lines, ``.jsonl`` or
``.jsonl.gz``), read a line at a time (a RecordingSet is held whole: supervisions look their
recording up). Each utterance is

- a cut of a CutSet: its segment of its recording (``start``, ``duration``, ``channel``) with
  the text of its one supervision. A cut holding several supervisions, or none, is refused
  (``CutSet.trim_to_supervisions()`` makes one cut per supervision);
- a supervision of a SupervisionSet: its segment of its recording.

The samples are read with soundfile from the recording's source file, as the LibriSpeech layout
reads its files: a cut spanning a whole file gives the same samples, hence the same features
byte for byte; a segment gives the samples lhotse's own ``cut.load_audio()`` gives
(``lhotse.utils.compute_num_samples`` for its first sample and length, lhotse's reflected
completion of a segment that the file ends less than 25 ms short of; tests/corpus/test_manifests.py).
One channel a cut: a MultiCut, a MixedCut, a recording with transforms (speed, resampling), or
audio other than a file (a URL, a command, bytes in memory) is refused, exit 2, naming the
manifest and the cut. Transcripts are normalized as LibriSpeech's: those outside the alphabet
or empty are dropped and reported per utterance (``prepare.json``), as are unreadable audio,
other sample rates and lengths out of range when features are computed.

lhotse parses the manifests (its ``deserialize_item``: every version of its format it reads); it
is the ``lhotse`` extra, imported only here, and a missing one is named with the command that
installs it.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from speechperf.corpus.alphabet import AlphabetError, normalize
from speechperf.corpus.librispeech import Problem, Utterance
from speechperf.errors import SpeechperfError

SUFFIXES = (".jsonl", ".jsonl.gz")
INSTALL = "pip install 'speechperf[lhotse]'"
_SPLIT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # a folder name of FEATS
KINDS = {"MonoCut": "cuts", "MultiCut": "cuts", "MixedCut": "cuts", "Recording": "recordings",
         "SupervisionSegment": "supervisions"}


class ManifestError(SpeechperfError):
    """A manifest that cannot be prepared: missing, of an unknown format, or a cut without
    usable audio or text. The message names the file and the cut."""


def _lhotse():
    """lhotse's deserializer and sample arithmetic; a ManifestError naming the extra if missing."""
    try:
        from lhotse.serialization import deserialize_item  # the optional lhotse extra
        from lhotse.utils import compute_num_samples
    except ImportError as e:
        raise ManifestError(f"reading lhotse manifests needs lhotse ({e}); install it with: {INSTALL}") from None
    return deserialize_item, compute_num_samples


@dataclass(frozen=True)
class SplitManifests:
    """One split's manifests: ``cuts``, or ``recordings`` and ``supervisions``."""

    split: str
    cuts: Path | None = None
    recordings: Path | None = None
    supervisions: Path | None = None
    count: int = 0  # utterances whose transcript is kept (split_manifests' pass over every line)
    in_order: bool = True  # that pass found them in the layout's scan order (scan_order): streamed as read

    @property
    def files(self) -> list[Path]:
        return [p for p in (self.cuts, self.recordings, self.supervisions) if p is not None]

    def utterances(self, problems: list[Problem]) -> Iterator[Utterance]:
        """The split's utterances in the LibriSpeech layout's scan order (:func:`scan_order`),
        appending dropped ones to ``problems``: as read, a line at a time, where the manifest
        holds them so (``in_order``); else held and sorted (lhotse's LibriSpeech recipe lists its
        chapters in the order the file system gives, so the same corpus gives the same features)."""
        found = self._read(problems)
        yield from found if self.in_order else sorted(found, key=lambda u: scan_order(u.id))

    def _read(self, problems: list[Problem]) -> Iterator[Utterance]:
        reader = _Reader(self.split, problems)
        if self.cuts is not None:
            yield from reader.cuts(self.cuts)
        else:
            yield from reader.supervised(self.recordings, self.supervisions)

    def estimate(self) -> int:
        """Utterances if all audio is usable (the progress bar's total)."""
        return self.count


def split_manifests(pairs: list[tuple[str, Path]]) -> list[SplitManifests]:
    """``--manifest SPLIT=PATH`` pairs as splits, in the order first named; each file's kind is
    read from its first line. Refuses (exit 2) a bad split name, a missing or unknown file, a
    split that is not one CutSet or one RecordingSet with one SupervisionSet, and any bad cut."""
    _lhotse()
    files: dict[str, dict[str, Path]] = {}
    for split, path in pairs:
        if not _SPLIT.match(split):
            raise ManifestError(f"--manifest {split}={path}: split name {split!r} is not a folder name "
                                f"(letters, digits, '.', '_', '-'; e.g. train, dev-clean, test-clean)")
        kind = manifest_kind(Path(path))
        if kind in files.setdefault(split, {}):
            raise ManifestError(f"split {split!r} names two {kind} manifests: {files[split][kind]} and {path}")
        files[split][kind] = Path(path)
    out = []
    for split, kinds in files.items():
        if set(kinds) not in ({"cuts"}, {"recordings", "supervisions"}):
            named = ", ".join(f"{k} ({p})" for k, p in kinds.items())
            raise ManifestError(f"split {split!r} has {named}: give one CutSet, or one RecordingSet and one "
                                f"SupervisionSet")
        split_files = SplitManifests(split, **kinds)
        # every line read once before any work: a bad cut is refused in seconds, not after the
        # hours of features that precede it (LibriSpeech 960 h's 281,241 cuts: see docs/data.md)
        keys = [scan_order(u.id) for u in split_files._read([])]
        out.append(dataclasses.replace(split_files, count=len(keys), in_order=keys == sorted(keys)))
    return out


def scan_order(uid: str) -> tuple[str, ...]:
    """The LibriSpeech layout's order of an utterance id (``SPEAKER-CHAPTER-NNNN``): its speaker's
    folder, its chapter's (corpus/librispeech.py sorts them by name), then the utterance; any
    other id by its dash-separated parts the same way."""
    return tuple(uid.split("-"))


def _open(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.name.endswith(".gz") else open(path, encoding="utf-8")


def _items(path: Path) -> Iterator[tuple[int, object]]:
    """(line number, lhotse object) of every line of ``path``; a line lhotse cannot read is a
    ManifestError naming the file and line."""
    deserialize_item, _ = _lhotse()
    try:
        with _open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield n, deserialize_item(json.loads(line))
                except Exception as e:  # json's, and lhotse's from_dict: TypeError, KeyError, ValueError...
                    raise ManifestError(f"{path}:{n}: not a lhotse manifest line ({type(e).__name__}: {e})") from None
    except FileNotFoundError:
        raise ManifestError(f"manifest {path} does not exist") from None
    except (OSError, UnicodeDecodeError, EOFError, zlib.error) as e:  # BadGzipFile: OSError; cut short: EOFError
        raise ManifestError(f"manifest {path} cannot be read ({type(e).__name__}: {e})") from None


def manifest_kind(path: Path) -> str:
    """"cuts", "recordings" or "supervisions": the kind of ``path``'s first item."""
    if not path.is_file():
        raise ManifestError(f"manifest {path} does not exist")
    if not path.name.endswith(SUFFIXES):
        raise ManifestError(f"manifest {path}: unknown format (expected lhotse JSON lines: {', '.join(SUFFIXES)})")
    for _, item in _items(path):
        kind = KINDS.get(type(item).__name__)
        if kind is None:
            raise ManifestError(f"manifest {path}: unknown format (its first item is a {type(item).__name__}, not a "
                                f"cut, recording or supervision)")
        return kind
    raise ManifestError(f"manifest {path} holds no items")


class _Reader:
    """Turns a split's cuts or supervisions into utterances, refusing bad manifests by cut."""

    def __init__(self, split: str, problems: list[Problem]):
        self.split, self.problems, self.seen = split, problems, set()
        _, self.num_samples = _lhotse()

    def cuts(self, path: Path) -> Iterator[Utterance]:
        for n, cut in _items(path):
            where = f"{path}: cut {getattr(cut, 'id', f'on line {n}')}"
            kind = type(cut).__name__
            if kind != "MonoCut":
                why = {"MultiCut": f"a multi-channel cut (channels {getattr(cut, 'channel', '?')}): speechperf reads "
                                   f"one channel a cut", "MixedCut": "a MixedCut (mixed or padded audio): speechperf "
                                   "reads one recording's segment a cut"}
                raise ManifestError(f"{where}: {why.get(kind, f'a {kind}, not a cut')}")
            if len(cut.supervisions) != 1:
                raise ManifestError(f"{where}: {len(cut.supervisions)} supervisions, speechperf takes one transcript a "
                                    f"cut (one cut per supervision: lhotse's CutSet.trim_to_supervisions())")
            if cut.recording is None:
                raise ManifestError(f"{where}: no recording (missing audio source)")
            uid = self._cut_id(cut, cut.supervisions[0])
            u = self._utterance(where, uid, cut.recording, cut.start, cut.duration, cut.channel, cut.supervisions[0])
            if u is not None:
                yield u

    def _cut_id(self, cut, sup) -> str:
        """The utterance's id: its supervision's where the cut is exactly that supervision and its
        id only lhotse's counter added to it (``CutSet.from_manifests`` names cut k of a set
        ``SUPERVISION-k``, which the LibriSpeech layout's ids lack); else the cut's own."""
        rate = cut.recording.sampling_rate
        whole = (self.num_samples(sup.start, rate) == 0
                 and self.num_samples(sup.duration, rate) == self.num_samples(cut.duration, rate))
        return sup.id if whole and re.fullmatch(re.escape(sup.id) + r"-\d+", cut.id) else cut.id

    def supervised(self, recordings: Path, supervisions: Path) -> Iterator[Utterance]:
        recs = {rec.id: rec for _, rec in _items(recordings)}
        for n, sup in _items(supervisions):
            where = f"{supervisions}: cut {getattr(sup, 'id', f'on line {n}')}"
            if type(sup).__name__ != "SupervisionSegment":
                raise ManifestError(f"{where}: a {type(sup).__name__}, not a supervision")
            if sup.recording_id not in recs:
                raise ManifestError(f"{where}: recording {sup.recording_id!r} is not in {recordings} "
                                    f"(missing audio source)")
            channel = sup.channel
            if isinstance(channel, list):
                if len(channel) != 1:
                    raise ManifestError(f"{where}: channels {channel}: speechperf reads one channel a cut")
                channel = channel[0]
            u = self._utterance(where, sup.id, recs[sup.recording_id], sup.start, sup.duration, channel, sup)
            if u is not None:
                yield u

    def _utterance(self, where, uid, rec, start, duration, channel, sup) -> Utterance | None:
        """The utterance, or None (a problem recorded) when its text is dropped."""
        if uid in self.seen:
            raise ManifestError(f"{where}: the id appears twice in split {self.split!r}")
        self.seen.add(uid)
        if sup.text is None:
            raise ManifestError(f"{where}: supervision {sup.id} has no text")
        path, column = _source(where, rec, channel)
        first, samples = self.num_samples(start, rec.sampling_rate), self.num_samples(duration, rec.sampling_rate)
        if first == 0 and samples == rec.num_samples:
            samples = -1  # the whole file, read as the LibriSpeech layout reads it
        try:
            text = normalize(sup.text)
        except AlphabetError as e:
            self.problems.append(Problem(path, "alphabet", f"{where}: {e}"))
            return None
        if not text:
            self.problems.append(Problem(path, "empty_transcript", f"{where}: empty transcript for {uid}"))
            return None
        return Utterance(uid, self.split, sup.speaker or "", rec.id, path, text, start=first, samples=samples,
                         channel=column, cut=where)


def _source(where: str, rec, channel: int) -> tuple[Path, int | None]:
    """(the file holding ``channel`` of ``rec``, its column there or None for a one-channel
    source); refuses what speechperf does not read as lhotse would."""
    if rec.transforms:
        names = ", ".join(t["name"] if isinstance(t, dict) else type(t).__name__ for t in rec.transforms)
        raise ManifestError(f"{where}: recording {rec.id} has transforms ({names}), which speechperf does not apply; "
                            f"write the transformed audio first (lhotse's CutSet.save_audios)")
    source = next((s for s in rec.sources if channel in s.channels), None)
    if source is None:
        raise ManifestError(f"{where}: recording {rec.id} has no source for channel {channel} (missing audio source)")
    if source.type != "file":
        raise ManifestError(f"{where}: recording {rec.id}'s audio is a {source.type!r} source; speechperf reads "
                            f"files (lhotse's 'file' sources)")
    path = Path(source.source)  # relative to the working directory, as lhotse reads it
    if not path.is_file():
        raise ManifestError(f"{where}: audio source {path} does not exist (missing audio source)")
    return path, (source.channels.index(channel) if len(source.channels) > 1 else None)
