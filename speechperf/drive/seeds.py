"""Seeds as a dimension of a run: one command trains one recipe with several seeds.

One seed cannot tell a machine's speed from the recipe's spread: two seeds of one recipe on
one machine can need different numbers of epochs to a target (the tiny preset's reference:
4 to 5 epochs), which moves TTA as much as a faster machine would. MLPerf Training times
several runs of each benchmark; ``speechperf train --seeds N`` makes that one command.

Each seed is a normal run folder (``OUT/seed-S`` for ``train``; the demo keeps its first
seed in ``DIR/run``), trained by :func:`speechperf.train.loop.train` with the override
``train.seed=S``, so its stored configuration carries the seed and the seeds of one command
differ in nothing else: ``tta`` and ``report`` group them (studies/aggregate.py). Seeds run
one after another and the command is resumable as a whole: run again, a finished seed is
only read (train's ``resume="auto"`` reports it without writing), an interrupted one
continues from its checkpoint, and the seeds after it are trained.

A seed that fails (diverged, or stopped by the machine) stops the command there, exit 1,
naming the seed and its folder: a recipe that diverges on one seed is broken and should
fail loudly before hours go into the others; a failed one (full disk, interrupted) is
continued by the same command once the cause is fixed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from speechperf.config import ConfigError
from speechperf.errors import RunFailed, SpeechperfError
from speechperf.train import loop  # loop.train looked up when called
from speechperf.train.request import TrainRequest

SEED_KEYS = ("train.seed", "seed")  # how an override can name the seed (load_preset resolves a bare field)
TRAINED = ("success", "time_cap", "max_epochs")  # a seed's run that trained to its end (cmd_train's exit 0)


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"5"`` -> seeds 1..5; ``"3,7"`` -> 3, 7; ``"6-10"`` -> 6..10; items may mix (``"1,4-6"``).

    A bare number is a count, as MLPerf counts runs; a list or a range names the seeds, so a
    later batch (``6-10``) adds seeds to an earlier one (``5``) without training them twice."""
    text = str(text).strip()
    if text.isdigit():
        if int(text) < 1:
            raise ConfigError(f"--seeds {text}: at least one seed")
        return tuple(range(1, int(text) + 1))
    seeds: list[int] = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        lo, sep, hi = item.partition("-")
        first, last = (_number(lo, text), _number(hi, text)) if sep else (_number(item, text),) * 2
        if first > last:
            raise ConfigError(f"--seeds {text}: range {item} runs backwards")
        seeds += range(first, last + 1)
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ConfigError(f"--seeds {text}: seed {', '.join(map(str, repeated))} named twice")
    if not seeds:
        raise ConfigError(f"--seeds {text!r}: no seed named")
    return tuple(seeds)


def _number(item: str, text: str) -> int:
    if not item.strip().isdigit():
        raise ConfigError(f"--seeds {text!r}: give a count N (seeds 1..N), a list 3,7 or a range 6-10")
    return int(item)


def seed_folder(out: Path, seed: int) -> Path:
    """``OUT/seed-S``: where ``train --seeds`` keeps seed S's run."""
    return Path(out) / f"seed-{seed}"


def refuse_seed_override(overrides: Sequence[str]) -> None:
    """``--seeds`` sets ``train.seed`` itself: an explicit one would be overridden silently or
    contradict it, so it is refused (exit 2), saying why."""
    given = [o for o in overrides if o.split("=", 1)[0].strip() in SEED_KEYS]
    if given:
        raise ConfigError(f"{given[0]} with --seeds: --seeds sets train.seed of each run itself; give the seeds as "
                          "--seeds (a count, a list 3,7 or a range 6-10) or drop --seeds to train one run")


def check_seeds_command(out: Path | None, overrides: Sequence[str]) -> Path:
    """What every seeds command needs before its first seed: --out (the seeds' folders go in
    it) and no explicit seed among the overrides (:func:`refuse_seed_override`); ``out`` as a Path."""
    if out is None:
        raise ConfigError("train --seeds needs --out DIR (one run folder per seed inside it)")
    refuse_seed_override(overrides)
    return Path(out)


def train_seeds(seeds: Sequence[int], request: TrainRequest, *, folder: Callable[[Path, int], Path] = seed_folder,
                say: Callable[[str], None] | None = None) -> list[dict]:
    """Train (or continue, or read again) one run per seed, in order; returns their summaries,
    each with its ``seed`` and ``run`` folder.

    ``request``: the command's, its ``out`` holding the seeds' folders; ``folder(out, seed)``: the
    seed's run folder (:func:`seed_folder`; the demo has its own). Each run's label gets `` seed S``
    (the derived one too, so that tables name the seed): :meth:`TrainRequest.for_seed`. Stops at
    the first seed that did not train to its end: exit 1, naming it."""
    out = check_seeds_command(request.out, request.overrides)
    say = say or (lambda msg: None)
    summaries = []
    for k, seed in enumerate(seeds):
        run = folder(out, seed)
        say(f"seed {seed} ({k + 1} of {len(seeds)}) -> {run}")
        try:
            summary = loop.train(request.for_seed(seed, run))
        except SpeechperfError as e:
            e.add_note(_stopped_at(seeds, k, run))  # the CLI prints notes on the error's line
            raise
        summaries.append({"seed": seed, **summary, "run": str(run)})
        status = str(summary.get("status"))
        if status not in TRAINED:
            raise RunFailed(f"seed {seed} ended {status} ({run}); {_stopped_at(seeds, k, run)}")
    return summaries


def _stopped_at(seeds: Sequence[int], k: int, run: Path) -> str:
    """Where a seeds command stopped, in words: the seed's folder and the seeds left untrained."""
    rest = list(seeds[k + 1:])
    left = f"seeds {', '.join(map(str, rest))} not trained" if rest else "it was the last seed"
    return f"stopped at seed {seeds[k]} ({run}): {left}"
