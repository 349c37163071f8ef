"""Reader for corpora in the LibriSpeech layout (real LibriSpeech, mini LibriSpeech, ours).

``SPLIT/SPEAKER/CHAPTER/SPEAKER-CHAPTER-NNNN.flac`` with one ``SPEAKER-CHAPTER.trans.txt``
per chapter holding ``ID TRANSCRIPT`` lines. Scanning checks the text side (missing audio,
audio without transcript, malformed lines, characters outside the alphabet, empty
transcripts); :func:`read_audio` checks the audio side when features are computed
(unreadable or truncated files, other sample rates, empty audio). Every problem names the
file; the good utterances go on.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import soundfile as sf

from speechperf.corpus.alphabet import AlphabetError, normalize
from speechperf.errors import SpeechperfError

AUDIO_EXTENSIONS = (".flac", ".wav")
_ID = re.compile(r"^(\d+)-(\d+)-(\d+)$")


def is_train_split(name: str) -> bool:
    """LibriSpeech's training splits (train-clean-100, train-clean-360, train-other-500) are
    trained together: any split named ``train*``."""
    return name.startswith("train")


class AudioError(SpeechperfError):
    """An audio file cannot be used; ``kind`` says why."""

    def __init__(self, path: Path, kind: str, message: str):
        super().__init__(f"{path}: {message}")
        self.path, self.kind = Path(path), kind


@dataclass(frozen=True)
class Utterance:
    id: str  # SPEAKER-CHAPTER-NNNN
    split: str  # split folder name
    speaker: str
    chapter: str
    audio_path: Path
    transcript: str  # normalized: lower case, alphabet only
    # A segment of a longer file (a lhotse manifest's cut, corpus/manifests.py); LibriSpeech
    # reads the whole file, every channel averaged.
    start: int = 0  # first sample
    samples: int = -1  # samples to read (-1: to the end of the file)
    channel: int | None = None  # column of the file to read (None: the mean of its channels)
    cut: str = ""  # "MANIFEST: cut ID", naming it in problems ("": a LibriSpeech file, its path names it)

    @property
    def where(self) -> str:
        """What a problem with this utterance names: its audio file, or its manifest and cut."""
        return self.cut or str(self.audio_path)


@dataclass(frozen=True)
class Problem:
    path: Path  # the file at fault
    kind: str  # missing_audio, missing_transcript, malformed_line, alphabet, empty_transcript, audio kinds
    message: str

    def to_dict(self) -> dict:
        return {"path": str(self.path), "kind": self.kind, "message": self.message}


@dataclass
class ScanResult:
    utterances: list[Utterance] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


def find_splits(root: Path) -> list[str]:
    """Folders of ``root`` that hold at least one chapter transcript."""
    root = Path(root)
    if not root.is_dir():
        raise SpeechperfError(f"corpus folder {root} does not exist")
    return sorted(p.name for p in root.iterdir() if p.is_dir() and next(p.glob("*/*/*.trans.txt"), None))


def scan_split(root: Path, split: str) -> ScanResult:
    """Every utterance of ``split`` with a usable transcript and an audio file."""
    result = ScanResult()
    result.utterances = list(iter_split(root, split, result.problems))
    return result


def iter_split(root: Path, split: str, problems: list[Problem]) -> Iterator[Utterance]:
    """:func:`scan_split`'s utterances one chapter at a time, in the same order, appending its
    problems to ``problems``: memory bounded by a chapter, not the split (960 h: 281,241)."""
    base = Path(root) / split
    if not base.is_dir():
        raise SpeechperfError(f"split {split!r} not found under {root}")
    for chapter_dir in sorted(p for p in base.glob("*/*") if p.is_dir()):
        part = ScanResult()
        _scan_chapter(chapter_dir, split, part)
        problems.extend(part.problems)
        yield from part.utterances


def _scan_chapter(folder: Path, split: str, result: ScanResult) -> None:
    speaker, chapter = folder.parent.name, folder.name
    audio = {p.stem: p for p in sorted(folder.iterdir()) if p.suffix in AUDIO_EXTENSIONS}
    trans = folder / f"{speaker}-{chapter}.trans.txt"
    seen: set[str] = set()
    if trans.exists():
        for n, line in enumerate(trans.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            uid, _, text = line.strip().partition(" ")
            where = f"{trans}:{n}"
            m = _ID.match(uid)
            if not m or (m.group(1), m.group(2)) != (speaker, chapter):
                result.problems.append(Problem(trans, "malformed_line",
                                               f"{where}: {uid!r} is not {speaker}-{chapter}-NNNN"))
                continue
            seen.add(uid)
            if uid not in audio:
                result.problems.append(Problem(trans, "missing_audio", f"{where}: no audio file for {uid}"))
                continue
            try:
                text = normalize(text)
            except AlphabetError as e:
                result.problems.append(Problem(audio[uid], "alphabet", f"{where}: {e}"))
                continue
            if not text:
                result.problems.append(Problem(audio[uid], "empty_transcript", f"{where}: empty transcript for {uid}"))
                continue
            result.utterances.append(Utterance(uid, split, speaker, chapter, audio[uid], text))
    for uid, path in audio.items():
        if uid not in seen:
            result.problems.append(Problem(path, "missing_transcript", f"{path}: no line for {uid} in {trans.name}"))


def read_audio(path: Path, expected_sr: int = 16000, start: int = 0, samples: int = -1,
               channel: int | None = None) -> np.ndarray:
    """Mono float32 samples (``samples`` from sample ``start``: a cut's segment; column ``channel``
    or the mean of the channels); AudioError (naming the file) if unreadable, truncated or of
    another rate."""
    try:
        audio, sr = sf.read(str(path), start=start, frames=samples, dtype="float32", always_2d=True)
    except Exception as e:  # libsndfile raises its own error type, RuntimeError or EOF errors
        raise AudioError(path, "unreadable_audio", f"cannot decode audio ({type(e).__name__}: {e})") from e
    if sr != expected_sr:
        raise AudioError(path, "sample_rate", f"sample rate {sr} Hz, expected {expected_sr} Hz (resample the corpus)")
    if channel is not None and channel >= audio.shape[1]:
        raise AudioError(path, "channel", f"no channel {channel} (the file has {audio.shape[1]})")
    # the requested column, else every channel's mean (a mono file's one column taken as it is, not averaged)
    audio = audio[:, channel] if channel is not None else audio[:, 0] if audio.shape[1] == 1 else audio.mean(axis=1)
    if samples >= 0 and len(audio) != samples:
        audio = _fit_segment(path, audio, samples, expected_sr)
    if audio.size == 0:
        raise AudioError(path, "empty_audio", "no samples")
    if not np.isfinite(audio).all():
        raise AudioError(path, "unreadable_audio", "non-finite samples")
    return audio


SEGMENT_TOLERANCE_S = 0.025  # lhotse's default duration mismatch tolerance (LHOTSE_AUDIO_DURATION_MISMATCH_TOLERANCE)


def _fit_segment(path: Path, audio: np.ndarray, samples: int, sr: int) -> np.ndarray:
    """A segment the file ends inside of: completed as lhotse does (reflected) when at most its
    tolerance short, an AudioError otherwise, so a cut's samples equal lhotse's own loading."""
    short = samples - len(audio)
    if short > int(np.ceil(SEGMENT_TOLERANCE_S * sr)) or short >= len(audio):
        raise AudioError(path, "segment_past_end", f"the segment needs {samples} samples, the file holds {len(audio)} "
                                                   f"from its start")
    return np.pad(audio, (0, short), mode="reflect")


def check_corpus(root: Path, splits: list[str] | None = None) -> list[dict]:
    """Rows per split: usable utterances and problems by kind (text side only)."""
    rows = []
    for split in splits or find_splits(root):
        scan = scan_split(root, split)
        kinds = Counter(p.kind for p in scan.problems)
        rows.append({"split": split, "utterances": len(scan.utterances), "problems": len(scan.problems),
                     **{k: kinds[k] for k in sorted(kinds)}})
    return rows
