"""What one ``train`` command asks: the run folder, the features, the configuration's source.

One frozen :class:`TrainRequest` carries a run's command line from the CLI (``cmd_train``)
through the seeds commands (drive/seeds.py, drive/seed_slots.py) and the demo to the loop
(train/loop.py) and the run folder's admission (train/admission.py), so each parameter is
declared here once. Its ``out`` is the run folder from construction on (``--resume RUN``'s
folder included), the one place that folder is derived.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from speechperf.config import ConfigError, RunConfig, load_preset
from speechperf.models import external
from speechperf.results.labels import default_label
from speechperf.results.view import RunView

RESUME_MODES = ("auto", "yes", "no")


def _path(value) -> Path | None:
    return Path(value) if value is not None else None


@dataclass(frozen=True)
class TrainRequest:
    """One run as the command line asks for it (``train --out RUN ...``)."""

    preset: str = "cpu"  # a preset's name or TOML file (config/presets/)
    data: Path | None = None  # the features folder (--data); None: a continued run's recorded one
    out: Path | None = None  # the run folder (--out; a run folder given to --resume is the run's)
    overrides: tuple[str, ...] = ()  # key=value settings over the preset
    # auto: continue a run of the same configuration found in out (a finished one is only
    # reported, another configuration refused); yes: insist on continuing; no: refuse an existing
    # run; a run folder: continue that run with its own configuration
    resume: str | Path | None = "auto"
    db_path: Path | None = None  # a shared database that receives the rows too (--db)
    quiet: bool = False  # no progress bar or epoch lines
    platform: str | None = None  # the platform named on the command line (train --platform)
    label: str | None = None  # the label given (--label); None: derived from the machine and configuration
    label_suffix: str = field(default="")  # appended to the label, given or derived (drive/seeds.py: " seed 2")
    # check(run, status): the finished run (its RunView, not a path) against its preset's reference,
    # for summary.json's "convergence" (studies/study.py's run_check, handed down by the command
    # that trains: cmd_train, the demo, the seeds commands); None: not checked (convergence null)
    check: Callable[[RunView, str], dict] | None = None
    allow_emulated: bool = False  # --allow-emulated: train in a precision this CPU only emulates (else refused, exit 2)

    def __post_init__(self):
        for name in ("data", "out", "db_path"):
            object.__setattr__(self, name, _path(getattr(self, name)))
        object.__setattr__(self, "overrides", tuple(self.overrides or ()))
        if self.resume_run is not None:  # --resume RUN: that folder is the run's, whatever --out says
            object.__setattr__(self, "out", self.resume_run)

    @property
    def resume_run(self) -> Path | None:
        """The run folder given to ``--resume`` (continued with its recorded configuration); None:
        a mode (auto, yes, no)."""
        return None if self.resume is None or str(self.resume) in RESUME_MODES else Path(self.resume)

    @property
    def mode(self) -> str:
        """auto, yes or no; a run folder given to --resume insists on continuing it (yes)."""
        return "yes" if self.resume_run is not None else "auto" if self.resume is None else str(self.resume)

    def configuration(self) -> RunConfig:
        """The run's configuration: the preset with its overrides, or, for ``--resume RUN`` (a
        folder), that run's recorded one."""
        if self.resume_run is not None:  # --resume RUN: that run, with its recorded configuration
            if self.overrides:
                raise ConfigError("a resumed run keeps its configuration; overrides are not allowed with --resume RUN")
            with external.reading(f"run folder {self.resume_run}"):  # its model's module: only a trusted one
                return RunConfig.from_dict(RunView.open(self.resume_run).config)
        if self.out is None:
            raise ConfigError("train needs --out RUN (and --data FEATS for a new run)")
        return load_preset(self.preset, list(self.overrides), self.platform)

    def given_label(self) -> str | None:
        """The label a new run would get from --label (and the suffix); None: none given."""
        return f"{self.label}{self.label_suffix}" if self.label is not None else None

    def run_label(self, env: dict, config: dict) -> str | None:
        """The new run's label: the given one or the derived one (machine, preset, precision), with
        the suffix; None: the derived one without suffix (Run.create derives it)."""
        if not self.label_suffix:
            return self.label
        return f"{self.label or default_label(env, config)}{self.label_suffix}"

    def for_seed(self, seed: int, out: Path, extra: tuple[str, ...] = ()) -> "TrainRequest":
        """Seed ``seed``'s run of a seeds command (drive/seeds.py): its own folder, ``extra``
        overrides, ``train.seed=S`` last and the label suffix `` seed S``."""
        return replace(self, out=Path(out), overrides=(*self.overrides, *extra, f"train.seed={seed}"),
                       label_suffix=f" seed {seed}")
