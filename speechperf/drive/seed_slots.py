"""Seeds side by side: ``train --seeds N --parallel K`` trains K seeds at once, one per device.

A machine with several GPUs can time one seed per GPU, so that five seeds take the time of
one. Each seed is its own process, the
ordinary one-run ``speechperf train --out OUT/seed-S ... train.seed=S`` (the run folder, label
and resume rules of drive/seeds.py's one after another), started with the slot's
device alone visible: ``CUDA_VISIBLE_DEVICES`` set to one of the GPUs this process sees. On a
CPU the slots share the cores: each seed gets ``train.system.threads = cores // K`` unless the
configuration names its threads (thread count changes the float sums, so it is recorded in
every run's configuration like any other field and groups them apart in ``tta``).

A seed that fails stops the command as one after another does: the seeds still training are
sent SIGTERM (each saves a checkpoint and stops as interrupted, train/stop.py), no new seed
starts, and the error names the failed seed, its folder and its log; the same command then
continues every unfinished seed. SIGTERM or SIGINT to this process does the same to its
seeds, and so does its death (SIGKILL, say: on Linux each seed asks the kernel for SIGTERM
when its parent dies, ``PR_SET_PDEATHSIG``), so no seed trains on unwatched. Each seed's
output (its epoch lines, its errors) goes to ``OUT/seed-S.log`` (K processes writing to one
terminal would interleave); its summary is read from its run folder. A seed that refuses
its input (exit 2: a run folder in use by another process, a configuration it cannot
continue) stops the command with exit 2 and the seed's own message.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from speechperf.config import ConfigError, load_preset
from speechperf.children import dies_with
from speechperf.cpus import usable_cpus
from speechperf.data.loader_config import SIDE_BY_SIDE
from speechperf.errors import RunFailed, SpeechperfError
from speechperf.drive.seeds import check_seeds_command, seed_folder
from speechperf.train.request import TrainRequest
from speechperf.results.view import RunView

POLL_S = 0.2  # how often the seeds' processes are polled
ERROR_PREFIX = "speechperf: error: "  # how a seed's process says why it stopped (cli.main)


def slot_settings(parallel: int, preset: str, overrides: Sequence[str], platform: str | None = None,
                  cuda_devices: Sequence[str] | None = None, cores: int | None = None) -> list[tuple[dict, list[str]]]:
    """Per slot: (environment additions, extra overrides). ``cuda_devices``: the GPUs this
    process sees (None: asked of torch); ``cores``: the CPUs it may use (None: its affinity)."""
    if parallel < 1:
        raise ConfigError(f"--parallel {parallel}: at least 1")
    cfg = load_preset(preset, list(overrides), platform)  # refuses a bad override before any seed starts
    tc = cfg.train
    if cuda_devices is None:
        cuda_devices = _visible_gpus()
    if tc.system.device != "cpu" and cuda_devices:
        if tc.system.device not in ("auto", "cuda"):
            raise ConfigError(f"--parallel {parallel} with train.system.device={tc.system.device}: each seed gets its "
                              "own GPU; drop train.system.device (or give cuda) to place them")
        if parallel > len(cuda_devices):
            raise ConfigError(f"--parallel {parallel}: {len(cuda_devices)} GPU(s) visible ({','.join(cuda_devices)}); "
                              "one seed per GPU")
        return [({"CUDA_VISIBLE_DEVICES": d}, []) for d in cuda_devices[:parallel]]
    cores = cores or usable_cpus()
    if tc.system.threads > 0:
        if tc.system.threads * parallel > cores:
            raise ConfigError(f"--parallel {parallel} x train.system.threads={tc.system.threads} is more than the "
                              f"{cores} CPUs this process may use: the seeds would slow each other unevenly")
        return [({}, [])] * parallel
    if parallel > cores:
        raise ConfigError(f"--parallel {parallel}: only {cores} CPUs; at least one thread per seed")
    return [({}, [f"train.system.threads={cores // parallel}"])] * parallel


def _visible_gpus() -> list[str]:
    if not torch.cuda.is_available():
        return []
    named = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in named.split(",") if d.strip()] if named else []
    return ids[:torch.cuda.device_count()] or [str(k) for k in range(torch.cuda.device_count())]


def seed_command(seed: int, request: TrainRequest) -> list[str]:
    """The command a slot runs: the one-run ``speechperf train --out RUN ... train.seed=S`` of
    seed ``seed``'s request (:meth:`TrainRequest.for_seed`: the label suffix `` seed S``)."""
    r = request
    argv = [sys.executable, "-m", "speechperf", "train", "--preset", r.preset, "--out", str(r.out), "--resume",
            str(r.resume), f"--label-suffix={r.label_suffix}"]
    for flag, value in (("--data", r.data), ("--label", r.label), ("--platform", r.platform), ("--db", r.db_path)):
        if value is not None:
            argv += [flag, str(value)]
    return argv + (["--allow-emulated"] if r.allow_emulated else []) + list(r.overrides)


def train_seeds_parallel(seeds: Sequence[int], parallel: int, request: TrainRequest, *,
                         say: Callable[[str], None] | None = None, folder: Callable[[Path, int], Path] = seed_folder,
                         command: Callable[[int, TrainRequest], list[str]] = seed_command,
                         **settings_kw) -> list[dict]:
    """Train the seeds of ``request`` (its ``out`` holding their folders) ``parallel`` at a time
    (:func:`slot_settings`); their summaries in seed order, as
    :func:`speechperf.drive.seeds.train_seeds` returns them. ``folder(out, seed)``: the seed's
    run folder (the demo has its own); ``command(seed, request)``: the argv of one seed's process
    (tests put a stand-in there)."""
    out = check_seeds_command(request.out, request.overrides)
    slots = slot_settings(parallel, request.preset, request.overrides, request.platform, **settings_kw)
    say = say or (lambda msg: None)
    out.mkdir(parents=True, exist_ok=True)
    todo, running, done = list(seeds), {}, {}  # running: slot -> (seed, Popen, log path, run folder)
    previous = {s: signal.signal(s, _raise_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while todo or running:
            starting = [k for k in range(len(slots)) if k not in running][:len(todo)]
            for slot in starting:
                seed = todo.pop(0)
                env, extra = _together(*slots[slot], len(starting))
                log, run = out / f"seed-{seed}.log", folder(out, seed)
                gpu = env.get("CUDA_VISIBLE_DEVICES")
                say(f"seed {seed} ({len(done) + len(running) + 1} of {len(seeds)}) -> {run}"
                    f"{' on GPU ' + gpu if gpu else ''}; its output: {log}")
                with open(log, "ab") as f:
                    argv = command(seed, request.for_seed(seed, run, tuple(extra)))
                    # its own session: a terminal's Ctrl-C reaches this process only, which asks each
                    # seed once (a second signal would stop a seed at once, without its checkpoint)
                    proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **env},
                                            start_new_session=True, preexec_fn=dies_with(os.getpid()))
                    running[slot] = (seed, proc, log, run, f.tell())  # f.tell(): where its output begins
            time.sleep(POLL_S)
            for slot, (seed, proc, log, run, start) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[slot]
                done[seed] = _finished(seed, proc, log, run, start)
    except BaseException as e:
        _stop_all(running)
        if isinstance(e, SpeechperfError):
            left = sorted(todo + [s for s, *_ in running.values()])
            e.add_note(f"seeds {', '.join(map(str, left))} not finished: the same command continues them" if left
                       else "every other seed finished")
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return [done[s] for s in seeds]


def _together(env: dict, extra: list, starting: int) -> tuple[dict, list]:
    """A slot's environment for a seed started with ``starting`` seeds at once: on a CPU (no device
    of its own) each is told how many fill a loader.resident buffer from the same free memory beside
    it (data/resident.py ``check_fits``); the seeds already training hold theirs already."""
    if env:  # its own GPU: its memory is its own
        return env, extra
    return {SIDE_BY_SIDE: str(starting)}, extra


class _Stopped(SpeechperfError):
    """This command was asked to stop; exit 128 + the signal's number (130 SIGINT, 143 SIGTERM)."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}: the seeds still training were asked to save "
                         "and stop")
        self.exit_code = 128 + signum


def _raise_stop(signum, frame):
    raise _Stopped(signum)


def _said(log: Path, start: int) -> str | None:
    """The error this seed's process printed (its last ``speechperf: error:`` line in its log,
    from ``start``, where its output begins), without the prefix; None if it printed none."""
    with open(log, "rb") as f:
        f.seek(start)
        lines = f.read().decode("utf-8", "replace").splitlines()
    said = [line[len(ERROR_PREFIX):] for line in lines if line.startswith(ERROR_PREFIX)]
    return said[-1] if said else None


def _finished(seed: int, proc: subprocess.Popen, log: Path, run: Path, start: int = 0) -> dict:
    """A seed's summary (its run folder's, read as ``train`` reports a finished run), or the
    error naming it: a seed that refused its input (exit 2: its folder in use by another
    process, say) with its own message and exit 2, not as a failed run."""
    proc.wait()
    refused = _said(log, start) if proc.returncode == 2 else None
    if refused is not None:
        raise SpeechperfError(f"seed {seed} ({run}; log {log}): {refused}")
    try:
        with RunView.open(run) as opened:  # None without a summary.json
            summary = opened.summary()
    except SpeechperfError:  # no run there at all (the process failed before making it)
        summary = None
    if proc.returncode == 0 and summary is not None:
        return {"seed": seed, **summary, "run": str(run)}
    status = f", its run's status {summary.get('status')!r}" if summary is not None else ""  # diverged: how
    tail = log.read_text(errors="replace").strip().splitlines()[-3:]
    raise RunFailed(f"seed {seed} exited {proc.returncode}{status} ({run}; log {log}): "
                    f"{' | '.join(tail) or 'no output'}")


def _stop_all(running: dict) -> None:
    """SIGTERM every seed still training, then wait for each to save and stop."""
    for _, proc, *_ in running.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for _, proc, *_ in running.values():
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
