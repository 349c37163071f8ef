"""Named presets: TOML files in ``presets/`` that fill the frozen stage configs.

A preset has sections ``[model]``, ``[loader]``, ``[train]``, ``[augment]`` and ``[algo]``
whose keys are fields of the model's own config (``[model] name`` picks the model; default
``ds2``), LoaderConfig, TrainConfig, SpecAugmentConfig and AlgoConfig (the data-parallel
algorithm); unknown keys are errors, missing keys keep the dataclass default.
Command-line overrides are ``key=value`` or ``section.key=value``; ``model.name=X``
switches the model first (to X's defaults), so the other model fields are read as X's.
A bare ``key`` is looked up in the stage sections (``BARE``) only: the algorithm's fields
are always written ``algo.key`` (its ``name`` and ``sync_every`` are the model's and the
loop's when bare, as before the section existed).
"""
from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from speechperf.data.config import LoaderConfig
from speechperf.data.specaugment import SpecAugmentConfig
from speechperf.decode import WORDBEAM_MODES
from speechperf.errors import SpeechperfError
from speechperf.models import config_class
from speechperf.models.ds2 import DS2Config
from speechperf.train.config import (ALGORITHMS, DIST_BACKENDS, OPTIMIZERS, PROTOCOLS, SCHEDULES, AlgoConfig,
                                     TrainConfig)

PRESET_DIR = Path(__file__).with_name("presets")
PLATFORM_DIR = Path(__file__).with_name("platforms")
# model: the default model's (each model has its own); augment: SpecAugment on training batches
# algo: the data-parallel algorithm (train/algorithm.py)
SECTIONS = {"model": DS2Config, "loader": LoaderConfig, "train": TrainConfig, "augment": SpecAugmentConfig,
            "algo": AlgoConfig}
BARE = ("model", "loader", "train", "augment")  # the sections a bare ``key=value`` override is looked up in


def section_kind(section: str, data: dict):
    """The dataclass of ``section`` in the preset ``data``: the model's depends on its name."""
    if section == "model":
        return config_class(data.get("model", {}).get("name", "ds2"))
    return SECTIONS[section]


class ConfigError(SpeechperfError, ValueError):
    """A preset or override names an unknown field or gives a value of the wrong type."""


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a training run; stored in every checkpoint and result."""

    preset: str = "custom"  # name of the preset this was built from
    model: object = field(default_factory=DS2Config)  # the config of the model [model] name selects
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    augment: SpecAugmentConfig = field(default_factory=SpecAugmentConfig)  # off unless a preset sets masks
    algo: AlgoConfig = field(default_factory=AlgoConfig)  # the data-parallel algorithm (sync: DDP under torchrun)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        return cls(
            preset=d.get("preset", "custom"),
            **{name: build_section(section_kind(name, d), d.get(name, {}), name) for name in SECTIONS},
        )


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
    if platform:
        data.setdefault("loader", {}).update(load_platform(platform).get("loader", {}))
    # the model's name first: the other model fields are then that model's
    for item in sorted(overrides, key=lambda item: item.split("=", 1)[0] not in ("model.name", "name")):
        _apply_override(data, item)
    cfg = RunConfig.from_dict({"preset": path.stem, **data})
    validate(cfg)
    return cfg


def _apply_override(data: dict, item: str) -> None:
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not key=value")
    key, raw = item.split("=", 1)
    if "." in key:
        section, name = key.split(".", 1)
        if section not in SECTIONS:
            raise ConfigError(f"override {item!r}: unknown section {section!r}")
    else:
        owners = [s for s in BARE if name_in(section_kind(s, data), key)]
        if len(owners) != 1:
            raise ConfigError(f"override {item!r}: field {key!r} is in {owners or 'no section'}; write section.{key}")
        section, name = owners[0], key
    kind = section_kind(section, data)
    if not name_in(kind, name):
        raise ConfigError(f"override {item!r}: {section} has no field {name!r}")
    value = _parse(kind, name, raw, item)
    if (section, name) == ("model", "name") and value != data.get("model", {}).get("name", "ds2"):
        config_class(value)  # an unknown model is named here
        data["model"] = {}  # the preset's model fields are its own model's: another starts from its defaults
    data.setdefault(section, {})[name] = value


def name_in(kind, name: str) -> bool:
    return name in {f.name for f in dataclasses.fields(kind)}


def _parse(kind, name: str, raw: str, item: str):
    default = getattr(kind(), name)
    try:
        if isinstance(default, bool):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1")
        return type(default)(raw)
    except ValueError:
        raise ConfigError(f"override {item!r}: {raw!r} is not a {type(default).__name__}") from None


def build_section(kind, values: dict, section: str):
    names = {f.name for f in dataclasses.fields(kind)}
    unknown = set(values) - names
    if unknown:
        raise ConfigError(f"[{section}] unknown keys {sorted(unknown)}")
    defaults = kind()
    for key, value in values.items():
        expected = type(getattr(defaults, key))
        ok = isinstance(value, expected) or (expected is float and isinstance(value, int) and not isinstance(value, bool))
        if not ok:
            raise ConfigError(f"[{section}] {key} = {value!r}: expected {expected.__name__}")
    return kind(**{k: (float(v) if isinstance(getattr(defaults, k), float) else v) for k, v in values.items()})


def validate(cfg: RunConfig) -> None:
    """Reject values that would fail later or cannot train, naming the field and value.

    Runs in ``load_preset``, before any run folder exists: a run that cannot train (an
    infinite learning rate skips every step, a batch of 0 never steps) is bad input (exit
    2), not a "successful" run of broken weights.
    """
    for name in SECTIONS:  # inf and nan pass every comparison below or fail it silently
        section = getattr(cfg, name)
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{name}.{f.name}={value} must be a finite number")
    for problem in cfg.model.problems() + cfg.augment.problems():
        raise ConfigError(problem)
    lo, t = cfg.loader, cfg.train
    checks = [
        (lo.batch_size >= 1, f"loader.batch_size={lo.batch_size} must be >= 1"),
        (lo.readers >= 0, f"loader.readers={lo.readers} must be >= 0"),
        (lo.prefetch_batches >= 1, f"loader.prefetch_batches={lo.prefetch_batches} must be >= 1"),
        (lo.bucket_window >= 1, f"loader.bucket_window={lo.bucket_window} must be >= 1"),
        (lo.pad_frames >= 1, f"loader.pad_frames={lo.pad_frames} must be >= 1"),
        (lo.mode in ("bucket", "pad"), f"loader.mode={lo.mode!r} must be 'bucket' or 'pad'"),
        (t.optimizer in OPTIMIZERS, f"train.optimizer={t.optimizer!r} must be one of {', '.join(OPTIMIZERS)}"),
        (t.lr > 0, f"train.lr={t.lr} must be > 0"),
        (t.weight_decay >= 0, f"train.weight_decay={t.weight_decay} must be >= 0"),
        (t.warmup_iters >= 0, f"train.warmup_iters={t.warmup_iters} must be >= 0"),
        (t.lr_decay > 0, f"train.lr_decay={t.lr_decay} must be > 0"),
        (t.lr_step_epochs >= 1, f"train.lr_step_epochs={t.lr_step_epochs} must be >= 1"),
        (t.lr_schedule in SCHEDULES, f"train.lr_schedule={t.lr_schedule!r} must be one of {', '.join(SCHEDULES)}"),
        (t.lr_schedule != "noam" or t.warmup_iters >= 1,
         f"train.lr_schedule=noam needs train.warmup_iters >= 1 (its peak), not {t.warmup_iters}"),
        (0 <= t.lr_min <= t.lr, f"train.lr_min={t.lr_min} must be in [0, train.lr={t.lr}]"),
        (t.grad_clip >= 0, f"train.grad_clip={t.grad_clip} must be >= 0 (0 disables clipping)"),
        (t.time_cap_minutes >= 0, f"train.time_cap_minutes={t.time_cap_minutes} must be >= 0 (0 = no cap)"),
        (t.stop_after_epochs >= 0, f"train.stop_after_epochs={t.stop_after_epochs} must be >= 0 (0 = off)"),
        (t.target >= 0, f"train.target={t.target} must be >= 0 (0 = never stop early)"),
        (t.eval_beam >= 1 and t.final_beam >= 1,
         f"train.eval_beam={t.eval_beam} and train.final_beam={t.final_beam} must be >= 1"),
        (t.threads >= 0, f"train.threads={t.threads} must be >= 0 (0 = torch default)"),
        (t.max_bad_losses >= 0, f"train.max_bad_losses={t.max_bad_losses} must be >= 0"),
        (0 < t.max_skipped_fraction <= 1,
         f"train.max_skipped_fraction={t.max_skipped_fraction} must be in (0, 1]"),
        (t.precision in ("fp32", "bf16", "fp16"), f"train.precision={t.precision!r} must be fp32, bf16 or fp16"),
        (t.target_metric in ("cer", "wer"), f"train.target_metric={t.target_metric!r} must be cer or wer"),
        (t.sentence_every >= 1 and t.checkpoint_every >= 1, "train.sentence_every and checkpoint_every must be >= 1"),
        (t.target_epochs >= 1, f"train.target_epochs={t.target_epochs} must be >= 1"),
        (t.max_epochs >= 1, f"train.max_epochs={t.max_epochs} must be >= 1"),
        (t.sync_every >= 1, f"train.sync_every={t.sync_every} must be >= 1"),
        (t.dist_backend in DIST_BACKENDS, f"train.dist_backend={t.dist_backend!r} must be one of {', '.join(DIST_BACKENDS)}"),
        (t.optimizer_impl in ("default", "foreach", "fused"),
         f"train.optimizer_impl={t.optimizer_impl!r} must be default, foreach or fused"),
        (t.optimizer_impl != "fused" or t.optimizer == "adamw",
         f"train.optimizer_impl=fused needs optimizer=adamw (torch has no fused {t.optimizer})"),
        (t.eval_mode in WORDBEAM_MODES, f"train.eval_mode={t.eval_mode!r} must be one of {', '.join(WORDBEAM_MODES)}"),
        (t.protocol in PROTOCOLS, f"train.protocol={t.protocol!r}: speechperf implements only {', '.join(PROTOCOLS)} "
                                  "(no AlgoPerf-faithful workload yet)"),
    ]
    for ok, msg in checks + _algo_checks(cfg.algo):
        if not ok:
            raise ConfigError(msg)


def _algo_checks(a: AlgoConfig) -> list[tuple[bool, str]]:
    """(holds, message) for the ``algo`` section; the worker count is checked at launch (train/algorithm.py)."""
    return [
        (a.name in ALGORITHMS, f"algo.name={a.name!r} is unknown; known: {', '.join(ALGORITHMS)}"),
        (a.sync_every >= 1, f"algo.sync_every={a.sync_every} must be >= 1"),
        (a.block_lr > 0, f"algo.block_lr={a.block_lr} must be > 0"),
        (a.block_momentum == -1 or 0 <= a.block_momentum < 1,
         f"algo.block_momentum={a.block_momentum} must be in [0, 1), or -1 (from block_lr and bmuf_c)"),
        (a.bmuf_c > 0, f"algo.bmuf_c={a.bmuf_c} must be > 0"),
        (a.outer_lr > 0, f"algo.outer_lr={a.outer_lr} must be > 0"),
        (0 <= a.outer_momentum < 1, f"algo.outer_momentum={a.outer_momentum} must be in [0, 1)"),
        (0 < a.easgd_alpha < 1, f"algo.easgd_alpha={a.easgd_alpha} must be in (0, 1)"),
    ]
