"""How a run folder's files are read: the format version, JSON with its shape checked, the
features folder it trained on.

Every reader of a run (results/view.py, results/run.py, the benchmarks) reads its JSON
files through :func:`read_json`, so that an unreadable file (cut short, not JSON, not an
object, valid JSON of the wrong shape: results/shapes.py) is refused by name, exit 2.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from speechperf.errors import SpeechperfError
from speechperf.features.stats import stats_sha256
from speechperf.results.layout import RUN_FILE
from speechperf.results.shapes import check_file

FORMAT = 2  # run.json "format": the only one this release reads


class RunError(SpeechperfError):
    """A run folder that cannot be opened as asked; the message names the folder and what is missing."""


def read_json(path: Path) -> dict:
    """The JSON object in one of a run folder's files; every reader of a run reads through
    here, so an unreadable file (cut short, not JSON, not an object) is refused by name."""
    try:
        data = parse_json(Path(path).read_bytes().decode("utf-8"), path)
    except UnicodeDecodeError as e:
        raise RunError(f"{path}: not valid JSON ({e}); the run folder is damaged") from e
    except OSError as e:
        raise RunError(f"{path}: cannot be read ({e.strerror or e})") from e
    if not isinstance(data, dict):
        raise RunError(f"{path}: not a JSON object (found {type(data).__name__}); the run folder is damaged")
    return check_file(Path(path).name, data, str(path))  # valid JSON of the wrong shape: refused by field


def parse_json(text: str, path) -> object:
    """``text`` (of the run file ``path``) parsed; whatever the parser refuses is a :class:`RunError`
    naming the file: not JSON, nested deeper than its recursion, an integer of more digits than
    Python converts (``sys.get_int_max_str_digits()``, 4,300: a ``ValueError`` that is no
    JSONDecodeError). No file speechperf writes holds any of them."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise RunError(f"{path}: not valid JSON ({e}); the run folder is damaged") from e
    except ValueError as e:  # int("1" * 5000): the digit limit of str -> int conversion
        raise RunError(f"{path}: not readable as JSON ({e}); the run folder is damaged") from None
    except RecursionError:
        raise RunError(f"{path}: nested too deeply to read; the run folder is damaged") from None


def read_info(folder: Path) -> dict:
    """The run.json of ``folder``, refused unless it names a run of this release's format."""
    path = Path(folder) / RUN_FILE
    if not path.is_file():
        raise RunError(f"{folder} is not a run folder (no {RUN_FILE})")
    info = read_json(path)
    if "run_id" not in info:
        raise RunError(f"{path} has no run_id: not a speechperf run folder")
    version = info.get("format")
    if isinstance(version, int) and version > FORMAT:
        raise RunError(f"{folder} was written by a newer speechperf (run folder format {version}; this release "
                       f"reads format {FORMAT}): upgrade speechperf to read it")
    if version != FORMAT:
        raise RunError(f"{path}: run folder format {version!r}; this speechperf reads format {FORMAT} only")
    return info


def label_hint(info: dict) -> str:
    """The run's name in error messages: its label, else its id."""
    return info.get("label") or info["run_id"]


def data_hint(data: Path, folder: Path) -> dict:
    """run.json's ``data``: the features folder as given, resolved and relative to the run
    folder (a hint only: the folder may move), and the statistics it normalizes with."""
    return {"given": str(data), "resolved": str(Path(data).resolve()),
            "relative": os.path.relpath(Path(data).resolve(), Path(folder).resolve()),
            "stats_sha256": stats_sha256(data)}  # the normalization it trains on (features/stats.py)


def features_folder(folder: Path, info: dict, override: Path | None) -> Path:
    """The prepared features folder: ``override`` (``--data``) where given, else the recorded one
    where it exists (relative to the run folder, as resolved, as given); else an error saying so."""
    if override is not None:
        if not (override / "features.json").is_file():
            raise RunError(f"{override} is not a prepared features folder (no features.json)")
        return override
    hint = info.get("data") or {}
    candidates = []
    if hint.get("relative"):
        candidates.append(Path(os.path.normpath(Path(folder) / hint["relative"])))
    candidates += [Path(hint[k]) for k in ("resolved", "given") if hint.get(k)]
    for c in candidates:
        if (c / "features.json").is_file():
            return c
    where = f" on {info['host']}" if info.get("host") else ""
    raise RunError(f"run {label_hint(info)} ({folder}): its features folder is not here (recorded as "
                   f"{hint.get('given')!r}, {hint.get('resolved') or hint.get('given')}{where}); "
                   "give --data FEATS")
