"""Named presets: TOML files in ``presets/`` that fill the frozen stage configs.

A preset has sections ``[model]``, ``[loader]``, ``[train]``, ``[augment]`` and ``[algo]``
whose keys are fields of the model's own config (``[model] name`` picks the model; default
``ds2``), LoaderConfig, TrainConfig, SpecAugmentConfig and the data-parallel algorithm's own
config (``[algo] name`` picks it; default ``sync``: speechperf/algorithms); unknown keys are
errors, missing keys keep the dataclass default. ``[train]`` has sections of its own, tables
``[train.optim]``, ``[train.schedule]``, ``[train.eval]``, ``[train.stop]``, ``[train.system]``
and ``[train.floor]`` (config/training/; ``speechperf train --help`` lists every key).
Command-line overrides are ``key=value`` or ``section.key=value`` (``train.optim.lr=0.1``); a
flat train key of an earlier release (``train.lr``, ``eval_decoder``, a preset's ``[train] lr``)
is read at its new place with a one-line note on stderr (config/training/moved.py); ``model.name=X``
switches the model first (to X's defaults), so the other model fields are read as X's;
``algo.name=X`` switches the algorithm first, keeping the preset's values of the fields X
also has. A bare ``key`` is looked up in the stage sections (``BARE``, train's own sections
included) only: the
algorithm's fields are always written ``algo.key`` (a bare ``name`` or ``sync_every`` is
the model's or the loop's).
"""
from __future__ import annotations

import dataclasses
import math
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from speechperf.algorithms import DEFAULT as DEFAULT_ALGO, algo_config, config_class as algo_class
from speechperf.algorithms.base import AlgoConfig
from speechperf.data.loader_config import LoaderConfig
from speechperf.data.specaugment import SpecAugmentConfig
from speechperf.data.units import num_classes_of
from speechperf.errors import ConfigError
from speechperf.models import check_contract, config_class, value_problems
from speechperf.models.ds2 import DS2Config
from speechperf.objectives import objective_of
from speechperf.section import build_section, keys, values
from speechperf.config.training import TrainConfig
from speechperf.config.training.moved import MOVED, upgrade_key, upgrade_train

CHAR_SEARCHES = ("beam", "wordbeam", "flashlight")  # CTC decoders that search the character alphabet

PRESET_DIR = Path(__file__).with_name("presets")
PLATFORM_DIR = Path(__file__).with_name("platforms")
# model: the default model's (each model has its own); augment: SpecAugment on training batches
# algo: the data-parallel algorithms' common base (each algorithm has its own: speechperf/algorithms)
SECTIONS = {"model": DS2Config, "loader": LoaderConfig, "train": TrainConfig, "augment": SpecAugmentConfig,
            "algo": AlgoConfig}
BARE = ("model", "loader", "train", "augment")  # the sections a bare ``key=value`` override is looked up in


def section_kind(section: str, data: dict):
    """The dataclass of ``section`` in the preset ``data``: the model's and the algorithm's
    depend on their name."""
    if section == "model":
        return config_class(data.get("model", {}).get("name", "ds2"))
    if section == "algo":
        return algo_class(data.get("algo", {}).get("name", DEFAULT_ALGO))
    return SECTIONS[section]


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a training run; stored in every checkpoint and result."""

    preset: str = "custom"  # name of the preset this was built from
    model: object = field(default_factory=DS2Config)  # the config of the model [model] name selects
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    augment: SpecAugmentConfig = field(default_factory=SpecAugmentConfig)  # off unless a preset sets masks
    algo: AlgoConfig = field(default_factory=algo_config)  # the config of the data-parallel algorithm [algo] name
    # selects (sync: DDP under torchrun)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        sections = {name: build_section(section_kind(name, d), d.get(name, {}), name)
                    for name in SECTIONS if name != "algo"}
        return cls(preset=d.get("preset", "custom"), algo=algo_config(d.get("algo", {})), **sections)


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def platform_names() -> list[str]:
    return sorted(p.stem for p in PLATFORM_DIR.glob("*.toml"))


def _read_toml(name: str, folder: Path, kind: str, allowed: set[str]) -> tuple[Path, dict]:
    """A named TOML file of ``folder`` (or a path), with only ``allowed`` sections."""
    path = Path(name) if name.endswith(".toml") else folder / f"{name}.toml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in folder.glob("*.toml")))
        raise ConfigError(f"unknown {kind} {name!r}; known: {known}")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: {e}") from e
    unknown = set(data) - allowed
    if unknown:
        raise ConfigError(f"{path}: unknown sections {sorted(unknown)}")
    return path, data


def load_platform(name: str) -> dict:
    """A platform profile: its ``[platform]`` facts (devices, prices) and ``[loader]`` values."""
    return _read_toml(name, PLATFORM_DIR, "platform", {"platform", "loader"})[1]


def load_preset(name: str, overrides: list[str] | tuple[str, ...] = (), platform: str | None = None) -> RunConfig:
    """Preset ``name`` (or a TOML path), then a platform's loader values, then ``key=value`` overrides."""
    path, data = _read_toml(name, PRESET_DIR, "preset", set(SECTIONS))
    if isinstance(data.get("train"), dict) and set(data["train"]) & set(MOVED) - TOP_TRAIN:
        old = sorted(set(data["train"]) & set(MOVED) - TOP_TRAIN)
        _note(f"{path}: [train] {', '.join(old)}: keys of an earlier release, read as "
              f"{', '.join(upgrade_key('train.' + k) for k in old)}")
        data["train"] = upgrade_train(data["train"])
    if platform:
        data.setdefault("loader", {}).update(load_platform(platform).get("loader", {}))
    # the model's and the algorithm's names first: the other fields are then theirs
    for item in sorted(overrides, key=lambda item: item.split("=", 1)[0] not in ("model.name", "name", "algo.name")):
        _apply_override(data, item)
    cfg = RunConfig.from_dict({"preset": path.stem, **data})
    validate(cfg)
    return cfg


TOP_TRAIN = {k for k, v in MOVED.items() if k == v}  # flat keys that stayed at train's top


def _note(text: str) -> None:
    print(f"speechperf: note: {text}", file=sys.stderr, flush=True)


def _apply_override(data: dict, item: str) -> None:
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not key=value")
    key, raw = item.split("=", 1)
    if "." not in key:
        key = _bare(data, key, item)
    elif upgrade_key(key) != key:  # an earlier release's flat train.X
        _note(f"override {key} is now {upgrade_key(key)}")
        key = upgrade_key(key)
    section, name = key.split(".", 1)
    if section not in SECTIONS:
        raise ConfigError(f"override {item!r}: unknown section {section!r}")
    kind = section_kind(section, data)
    if not name_in(kind, name):
        raise ConfigError(f"override {item!r}: {section} has no field {name!r}")
    value = _parse(kind, name, raw, item)
    if (section, name) == ("model", "name") and value != data.get("model", {}).get("name", "ds2"):
        config_class(value)  # an unknown model is named here
        data["model"] = {}  # the preset's model fields are its own model's: another starts from its defaults
    if (section, name) == ("algo", "name"):
        kept = {f.name for f in dataclasses.fields(algo_class(value))}  # an unknown algorithm is named here
        data["algo"] = {k: v for k, v in data.get("algo", {}).items() if k in kept}
    *parents, leaf = name.split(".")
    node = data.setdefault(section, {})
    for parent in parents:
        node = node.setdefault(parent, {})
    node[leaf] = value


def _bare(data: dict, key: str, item: str) -> str:
    """A bare ``key``'s ``section.key``: the one stage section (train's own sections included)
    holding a field of that name, a section's own field before one of train's sections (``name``
    is the model's, ``mode`` the loader's); a flat train key of an earlier release as its place in
    :data:`MOVED` (``threads``: train.system.threads; ``eval_decoder`` with a note)."""
    owners = [f"{s}.{path}" for s in BARE for path in leaves(section_kind(s, data)) if path.split(".")[-1] == key]
    top = [o for o in owners if o.count(".") == 1]
    if len(owners) == 1 or len(top) == 1:
        return (top or owners)[0]
    if key in MOVED:
        if MOVED[key].split(".")[-1] != key:
            _note(f"override {key} is now train.{MOVED[key]}")
        return f"train.{MOVED[key]}"
    raise ConfigError(f"override {item!r}: field {key!r} is in {owners or 'no section'}; write section.{key}")


def leaves(kind) -> list[str]:
    """The dotted names of ``kind``'s value fields, nested sections walked (``optim.lr``)."""
    return [k.split(".", 1)[1] for k, _, _ in keys(kind, "_")]


def name_in(kind, name: str) -> bool:
    return name in leaves(kind)


def _default(kind, name: str):
    value = kind()
    for part_name in name.split("."):
        value = getattr(value, part_name)
    return value


def _parse(kind, name: str, raw: str, item: str):
    default = _default(kind, name)
    try:
        if isinstance(default, bool):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1")
        return type(default)(raw)
    except ValueError:
        raise ConfigError(f"override {item!r}: {raw!r} is not a {type(default).__name__}") from None


def validate(cfg: RunConfig) -> None:
    """Reject values that would fail later or cannot train, naming the field and value.

    Runs in ``load_preset``, before any run folder exists: a run that cannot train (an
    infinite learning rate skips every step, a batch of 0 never steps) is bad input (exit
    2), not a "successful" run of broken weights.
    """
    for name in SECTIONS:  # inf and nan pass every comparison below or fail it silently
        for key, value in values(getattr(cfg, name), name):
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{key}={value} must be a finite number")
    for problem in value_problems(cfg.model):  # a model's own (one from outside the package: named if it raises)
        raise ConfigError(problem)
    for section in (cfg.augment, cfg.loader, cfg.train, cfg.algo):
        for problem in section.problems():
            raise ConfigError(problem)
    check_contract(cfg.model)  # a model from outside the package: built on meta and tried, named if it falls short
    if cfg.model.num_classes != num_classes_of(cfg.loader.units):  # the labels' classes are the model's outputs
        raise ConfigError(f"model.num_classes={cfg.model.num_classes} does not match loader.units={cfg.loader.units!r} "
                          f"({num_classes_of(cfg.loader.units)} classes)")
    if cfg.train.system.cuda_graphs and cfg.model.name != "ds2":
        raise ConfigError(f"train.system.cuda_graphs=true needs model ds2 (a forward pass of static shapes, "
                          f"DeepSpeech2.masked), not model {cfg.model.name!r}")
    objective = objective_of(cfg.model)  # its epochs and its final evaluation decode with train.eval.decoder
    if objective.name == "ctc" and cfg.loader.units != "char" and cfg.train.eval.decoder in CHAR_SEARCHES:
        raise ConfigError(f"train.eval.decoder={cfg.train.eval.decoder!r} searches characters; with "
                          f"loader.units={cfg.loader.units!r} evaluate with train.eval.decoder='greedy'")
    if cfg.train.eval.decoder not in objective.decoders:
        raise ConfigError(f"train.eval.decoder={cfg.train.eval.decoder!r} cannot decode model {cfg.model.name!r} "
                          f"({objective.name}); its decoders: {', '.join(objective.decoders)}")
