"""Models from outside the package: ``model.name=MODULE:NAME`` and the contract check.

A model file outside speechperf looks exactly like one inside it (a frozen config dataclass and
a builder decorated with ``@register_model(NAME, Config)``). ``MODULE:NAME`` imports ``MODULE``
from the Python path, whose decorator registers ``NAME``; the run's config keeps ``MODULE:NAME``
so that a resumed run, ``eval`` or ``tta`` imports it again (a module, never anything
unpickled from the run folder). Installed packages list their model modules under the entry-point
group ``speechperf.models`` instead (the registry imports them with the built-in ones).

Such a model is checked against the contract of :mod:`speechperf.models.contract` before a
run folder exists: its config class here (:func:`config_problems`), the model it builds in
:func:`model_problems` (built on the meta device: no memory, no time per parameter).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import re
import sys
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn as nn

from speechperf.errors import ConfigError
from speechperf.models.contract import AcousticModel

ENTRY_POINTS = "speechperf.models"  # the entry-point group an installed package lists its model modules under
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")  # a dotted module name: no path, no relative import
FIELDS = ("name", "input_dim", "num_classes")  # every model config's fields (contract.py)
PROBE = 2, 160, 93  # the meta batch a model's plan and forward are tried on: (B, T, features)


class ModelContractError(ConfigError):
    """A model named from outside the package that does not import, or does not meet the contract."""


def registered_name(name: str) -> str:
    """The name a model registered under: ``NAME`` of ``MODULE:NAME``; a built-in name as it is."""
    return name.rpartition(":")[2]


class UntrustedModel(ModelContractError):
    """A model module that only a run folder (or a reference file) names: never imported unless the
    command line names it too (``--trust-model MODULE``)."""


_TRUSTED: set[str] = set()  # modules the command line named (--trust-model, its own model.name=MODULE:NAME)
_READING: list[str] = []  # what is being read, innermost last: a run folder, a checkpoint, a reference


def trust(modules) -> None:
    """Let a model module named by what a command reads be imported: the user named it on the
    command line (``--trust-model MODULE``, or ``model.name=MODULE:NAME`` of a new run)."""
    _TRUSTED.update(m for m in modules if m)


def module_of(name: str) -> str | None:
    """``MODULE`` of ``MODULE:NAME``; None for a built-in or an installed entry point's ``NAME``."""
    return name.rpartition(":")[0] or None


@contextmanager
def reading(where) -> Iterator[None]:
    """While the block reads ``where`` (a run folder, its checkpoint, a reference file): data from
    elsewhere. A ``MODULE:NAME`` it names is imported only where the command line trusted MODULE;
    else :class:`UntrustedModel` (exit 2) names the module and the flag."""
    _READING.append(str(where))
    try:
        yield
    finally:
        _READING.pop()


def _check_trusted(name: str, module: str) -> None:
    if _READING and module not in _TRUSTED:
        raise UntrustedModel(f"{_READING[-1]} names model {name!r}, whose module {module!r} speechperf does not "
                             f"import from what it reads (a run folder is data and runs no code): give "
                             f"--trust-model {module} (with {module} on PYTHONPATH) to import it")


def import_model(registry, name: str):
    """The registry's entry for ``MODULE:NAME``, importing ``MODULE`` (on the Python path) first.
    :class:`ModelContractError` naming ``name`` when it does not import or registers no ``NAME``;
    :class:`UntrustedModel` while :func:`reading` a folder that names a module the command line did not.
    What the module prints while it imports goes to stderr (stdout may be a command's ``--json``)."""
    module, _, short = name.rpartition(":")
    if not _MODULE.fullmatch(module) or not short:
        raise ModelContractError(f"model {name!r} is not MODULE:NAME (a module on the Python path, "
                                 f"then the model name its @register_model gives)")
    _check_trusted(name, module)
    registry.load()  # the built-ins first: a module that claims one of their names is named so
    try:
        with contextlib.redirect_stdout(sys.stderr):
            importlib.import_module(module)
    except Exception as e:  # whatever the user's module raises while it runs
        if isinstance(e, ModuleNotFoundError) and e.name and _within(module, e.name):  # not a dependency of it
            raise ModelContractError(f"model {name!r}: no module {e.name!r} on the Python path; "
                                     f"PYTHONPATH names the folder that holds it") from None
        raise ModelContractError(f"model {name!r}: module {module!r} fails to import: "
                                 f"{type(e).__name__}: {e}") from None
    spec = dict.get(registry, short)
    origin = getattr(getattr(spec, "build", None), "__module__", "") or ""
    if spec is None or not _within(origin, module):
        mine = sorted(k for k, v in registry.items() if _within(getattr(v.build, "__module__", ""), module))
        raise ModelContractError(f"model {name!r}: module {module!r} registers no model {short!r} "
                                 f"(it registers: {', '.join(mine) or 'none'}; "
                                 f"@register_model({short!r}, Config) on its builder does)")
    return spec


def _within(origin: str, module: str) -> bool:
    """Whether code of module ``origin`` is ``module``'s own (itself or a submodule it imports)."""
    return origin == module or origin.startswith(module + ".")


def config_problems(name: str, kind: type) -> list[str]:
    """What model ``name``'s config class lacks of the contract: a frozen dataclass with
    ``name``, ``input_dim``, ``num_classes`` and ``problems()``."""
    if not (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
        return [f"its config {kind!r} is not a dataclass"]
    frozen = kind.__dataclass_params__.frozen
    out = [] if frozen else [f"its config {kind.__name__} is not frozen (@dataclass(frozen=True))"]
    fields = {f.name for f in dataclasses.fields(kind)}
    out += [f"its config {kind.__name__} has no field {f!r}" for f in FIELDS if f not in fields]
    if not callable(getattr(kind, "problems", None)):
        out.append(f"its config {kind.__name__} has no problems() (one message per invalid value)")
    return out


def value_problems(cfg) -> list[str]:
    """``cfg.problems()`` of a model config from outside the package, as messages: one that raises,
    or returns anything but messages, is named with what it did (never a traceback from its code)."""
    try:
        found = list(cfg.problems())
    except Exception as e:  # whatever the user's code raises
        return [f"model {cfg.name!r}: its config's problems() raises {type(e).__name__}: {e}"]
    if not all(isinstance(p, str) for p in found):
        return [f"model {cfg.name!r}: its config's problems() returns {found!r}, not a list of messages"]
    return found


def model_problems(name: str, build, cfg) -> list[str]:
    """What the model ``build(cfg)`` makes lacks of the contract, tried on the meta device: an
    ``nn.Module`` with ``min_frames``, ``output_lengths`` and ``plan`` on CPU lengths, and a
    ``forward`` giving log-probabilities ``(T', B, num_classes)`` and lengths ``(B,)``."""
    try:
        with torch.device("meta"):
            model = build(cfg)
    except Exception as e:
        return [f"its builder fails on {cfg}: {type(e).__name__}: {e}"]
    if not isinstance(model, nn.Module):
        return [f"its builder returns {type(model).__name__}, not an nn.Module (contract.AcousticModel)"]
    kind, frames = type(model), getattr(model, "min_frames", None)
    out = [f"its model {kind.__name__} has no {m}()" for m in _methods_missing(kind)]
    if not isinstance(frames, int) or frames < 1:
        out.append(f"its model {kind.__name__} has no min_frames (an int >= 1), it has {frames!r}")
    return out or _probe(model, cfg)


def _methods_missing(kind: type) -> list[str]:
    """The contract's methods a model class leaves undefined: AcousticModel's ``plan`` serves any
    model, its ``output_lengths`` and ``forward`` (as nn.Module's ``forward``) only raise."""
    unimplemented = (None, AcousticModel.output_lengths, AcousticModel.forward, nn.Module.forward)
    out = [m for m in ("output_lengths", "forward") if getattr(kind, m, None) in unimplemented]
    return out + ([] if callable(getattr(kind, "plan", None)) else ["plan"])


def _probe(model: nn.Module, cfg) -> list[str]:
    """Plan and run one meta batch through the model, as the training step does."""
    b, t, f = PROBE
    t = max(t, model.min_frames)
    lens = torch.tensor([t, max(model.min_frames, t // 2)])
    try:
        out_lens, planned = model.plan(lens, t)
        log_probs, _ = model(torch.zeros(b, t, f, device="meta"), lens.to("meta"),
                             **{k: v.to("meta") for k, v in planned.items()})
    except NotImplementedError as e:  # an op without a meta kernel: the shapes stay unchecked here
        return [] if "meta" in str(e).lower() else [f"its model raises NotImplementedError: {e}"]
    except Exception as e:
        return [f"its model fails on a batch of {b} x {t} frames x {f} features: {type(e).__name__}: {e}"]
    want = f"(T' >= {int(out_lens.max())}, {b}, {cfg.num_classes})"
    if not (isinstance(log_probs, torch.Tensor) and log_probs.dim() == 3 and log_probs.shape[1:] == (b, cfg.num_classes)
            and log_probs.shape[0] >= int(out_lens.max())):
        got = tuple(log_probs.shape) if isinstance(log_probs, torch.Tensor) else type(log_probs).__name__
        return [f"its forward returns log-probabilities {got}, not {want}"]
    return []


def refuse(name: str, problems: list[str]) -> None:
    """One :class:`ModelContractError` naming the model and all it lacks, if anything."""
    if problems:
        raise ModelContractError(f"model {name!r} does not meet the model contract (speechperf/models/contract.py): "
                                 + "; ".join(problems))
