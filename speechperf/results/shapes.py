"""The shapes of a run folder's JSON files, checked wherever one is read.

A run folder may come from another machine, so its files are data that can be valid JSON
of the wrong shape (``config.json`` = ``{"train": "x"}``). Every reader goes through
:func:`check_shape` (results/formats.py ``read_json``), so such a file is refused by name and
field (exit 2) instead of surfacing as a traceback deep in a table. Only fields that are
present are checked: a missing field is each reader's to default.

A spec is a type or a tuple of types (``type(None)`` for null; one member may be a dict spec),
a dict of field specs (``"*"``: the spec of any other field), or ``[spec]``: a list whose
items match spec.
"""
from __future__ import annotations

from speechperf import metric
from speechperf.errors import SpeechperfError
from speechperf.results.layout import CONFIG_FILE, ENV_FILE, RUN_FILE, SUMMARY_FILE

NUM = (int, float)
SCALAR = (str, int, float, bool, type(None))
OPT_STR = (str, type(None))
OPT_NUM = (int, float, type(None))
SECTION = {"*": (str, int, float, bool, type(None), list)}  # one stage's config: plain values

RUN = {"format": int, "run_id": str, "kind": OPT_STR, "label": OPT_STR, "host": OPT_STR, "created_at": OPT_NUM,
       "data": {"given": OPT_STR, "resolved": OPT_STR, "relative": OPT_STR, "stats_sha256": OPT_STR},
       "workload": {"model": str, "params": (int, type(None))}}
# train: its values and its sections (optim, schedule, eval, stop, system, floor: config/training/)
CONFIG = {"preset": OPT_STR, "model": SECTION, "loader": SECTION, "train": {"*": (*SECTION["*"], SECTION)},
          "augment": SECTION,
          "features": SECTION, "algo": SECTION}
# train.system.precision=auto's choice (train/auto_precision.py): env.json and summary.json
CHOICE = {"chosen": str, "candidates": {"*": NUM}, "cached": bool, "seconds": OPT_NUM, "shape": [NUM],
          "not_native": {"*": OPT_STR}, "note": OPT_STR, "measured_at": OPT_STR}
ENV = {"hostname": OPT_STR, "os": OPT_STR, "python": OPT_STR, "cpu_model": OPT_STR, "cpu_cores_physical": OPT_NUM,
       "cpu_cores_logical": OPT_NUM, "cpu_affinity": OPT_NUM, "memory_gb": OPT_NUM, "device": OPT_STR,
       "gpus": [{"index": OPT_NUM, "name": OPT_STR, "memory_gb": OPT_NUM, "*": SCALAR}],
       "cuda": OPT_STR, "cudnn": (str, int, type(None)), "torch_threads": OPT_NUM, "world_size": OPT_NUM,
       "libraries": {"*": OPT_STR}, "telemetry": (dict,), "cloud_instance": (dict, type(None)),
       "platform": OPT_STR, "precision_note": OPT_STR, "precision_choice": (CHOICE, type(None))}
SUMMARY = {"run": OPT_STR, "run_id": OPT_STR, "status": str, "epochs": OPT_NUM, "iterations": OPT_NUM,
           "clock_min": OPT_NUM, "init_s": OPT_NUM, **{f"last_{name}": OPT_NUM for name in metric.targets()},
           "precision_choice": (CHOICE, type(None)),
           "mfu_pct": OPT_NUM, "mfu_note": OPT_STR, "tflops": OPT_NUM, "peak_tflops": OPT_NUM,
           "convergence": (dict, type(None)),
           "floor": ({"epoch": OPT_NUM, "first_iteration": OPT_NUM, "steps": OPT_NUM, "floor_s": OPT_NUM,
                      "loop_s": OPT_NUM, "loop_over_floor": OPT_NUM, "utterances": OPT_NUM, "note": OPT_STR,
                      "asked": OPT_NUM, "span": OPT_NUM, "windows": OPT_NUM, "epochs": OPT_NUM,
                      "last_iteration": OPT_NUM, "loop_over_floor_p10": OPT_NUM, "loop_over_floor_p90": OPT_NUM,
                      "outliers": [{"iteration": NUM, "last": NUM, "ratio": NUM}],
                      "outlier_count": OPT_NUM, "floor_tflops": OPT_NUM, "loop_tflops": OPT_NUM,
                      "run_over_floor": OPT_NUM, "replay_s": OPT_NUM, "clock_s": OPT_NUM,
                      "replay_others_pct": OPT_NUM, "replay_shared": (bool, type(None))}, type(None)),
           "shared": ({"shared": bool, "contended %": NUM, "others % mean": NUM, "samples": NUM, "first s": OPT_NUM,
                       "last s": OPT_NUM, "threads": NUM, "cpus": NUM}, type(None)),
           "cuda_graphs": ({"shapes": NUM, "eval shapes": NUM, "capture s": NUM, "eager steps": NUM, "grid": [NUM]},
                           type(None))}
SPECS = {RUN_FILE: RUN, CONFIG_FILE: CONFIG, ENV_FILE: ENV, SUMMARY_FILE: SUMMARY}
# Fields a file cannot lack: every summary says how its run ended (readers default the rest).
REQUIRED = {SUMMARY_FILE: ("status",)}
# A file of many optional fields (an older release wrote fewer): one holding fields, none of them
# its own (``{"train": "x"}``), is another file's content, not an older one's.
KNOWN_FIELDS = (ENV_FILE,)


class ShapeError(SpeechperfError):
    """A run file that is valid JSON of the wrong shape; the message names file and field."""


def check_shape(data, spec, where: str, path: str = "") -> None:
    """Raise :class:`ShapeError` naming ``where`` and the first field of ``data`` that does
    not match ``spec``."""
    if isinstance(spec, dict):
        if not isinstance(data, dict):
            _fail(where, path, "an object", data)
        for key, value in data.items():
            sub = spec.get(key, spec.get("*"))
            if sub is not None:
                check_shape(value, sub, where, f"{path}.{key}" if path else str(key))
    elif isinstance(spec, list):
        if not isinstance(data, list):
            _fail(where, path, "a list", data)
        for i, item in enumerate(data):
            check_shape(item, spec[0], where, f"{path}[{i}]")
    else:
        types = spec if isinstance(spec, tuple) else (spec,)
        nested = [t for t in types if isinstance(t, dict)]
        if nested and isinstance(data, dict):  # (str, {...}): either a plain value or that object
            return check_shape(data, nested[0], where, path)
        types = tuple(dict if isinstance(t, dict) else t for t in types)
        # a bool is an int to Python; a field that wants a number does not want true/false
        if not isinstance(data, types) or (isinstance(data, bool) and bool not in types):
            _fail(where, path, " or ".join(_name(t) for t in types), data)


def check_file(name: str, data: dict, where: str) -> dict:
    """``data`` read from the run file ``name`` (run.json, config.json, env.json,
    summary.json), checked against its spec; other names pass unchecked."""
    if name in SPECS:
        check_shape(data, SPECS[name], where)
        for field in REQUIRED.get(name, ()):
            if field not in data:
                raise ShapeError(f"{where}: field {field!r} is missing; the file is damaged or not speechperf's")
        if name in KNOWN_FIELDS and data and not set(data) & set(SPECS[name]):
            raise ShapeError(f"{where}: field {next(iter(data))!r} is not one of {name}'s, and none of them is "
                             "here; the file is damaged or not speechperf's")
    return data


def _name(t) -> str:
    return {type(None): "null", str: "a string", int: "an integer", float: "a number", bool: "true/false",
            dict: "an object", list: "a list"}.get(t, t.__name__)


def _fail(where: str, path: str, want: str, got) -> None:
    shown = repr(got) if len(repr(got)) <= 40 else repr(got)[:37] + "..."
    raise ShapeError(f"{where}: field {path or '(top level)'!r} should be {want}, found {type(got).__name__} "
                     f"{shown}; the file is damaged or not speechperf's")
