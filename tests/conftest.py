"""Shared fixtures: one tiny synthesized corpus, its features and a run trained on them per test
session; ``cli``, the command line as a user runs it; the ``cuda`` marker: CUDA variants of core
tests run where torch sees a GPU, skip elsewhere; every other test runs as on a machine without
a GPU, also on one with a GPU."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from tests import forked_cli

HAS_CUDA = torch.cuda.is_available()
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def worker_threads(cores: int, workers: int) -> int:
    """Threads each of ``workers`` pytest-xdist workers may use on ``cores`` cores, at least one."""
    return max(1, cores // max(workers, 1))


def _share_the_cores() -> None:
    """Under pytest-xdist every worker's torch would take all the cores (16 workers x 16
    threads on a 16-core machine: end-to-end cases ran out their timeouts): each worker gets
    its share, in torch here and, through OMP_NUM_THREADS, in the CLI and torchrun
    subprocesses it starts. An OMP_NUM_THREADS the user set is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers < 1 or "OMP_NUM_THREADS" in os.environ:  # torch's own default reads it
        return
    n = worker_threads(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
                       workers)
    os.environ.update({v: str(n) for v in THREAD_VARS})
    torch.set_num_threads(n)


_share_the_cores()


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true",
                     help="the fast tier: no test that starts a process or trains a whole run (tests/tiers.py)")


def pytest_collection_modifyitems(config, items):
    from tests.tiers import mark_tiers

    mark_tiers(config, items)
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("cuda") is not None and not HAS_CUDA:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _threads_kept():
    """torch's thread count put back after each test: a test (or the library code it calls, a
    benchmark's ``--threads``, a run's ``train.system.threads``) that sets it would leave the rest of
    its worker on that count, not the worker's share (found: four tests left it at 1 or 4, the
    benchmarks' runs and bench scale's one-device row)."""
    n = torch.get_num_threads()
    yield
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_process(request, monkeypatch):
    """Under --fast, a test that starts a process fails, naming itself (tests/tiers.py)."""
    if request.config.getoption("fast"):
        from tests.tiers import refuse_processes

        refuse_processes(monkeypatch, request.node.nodeid)


@pytest.fixture(autouse=True)
def _a_machine_without_gpu(request, monkeypatch):
    """Unmarked tests state what a machine without a GPU (CI's) does: exact CPU resumes, no
    GPU price, no NVML energy. On a GPU machine they would train on the GPU and read its
    counters, so there they see none: torch reports no CUDA device (this process and, through
    CUDA_VISIBLE_DEVICES, its subprocesses) and neither NVML nor, on ROCm, amdsmi opens in this
    process (stand-ins passed to the sampler still do). The ``cuda``-marked tests are the GPU
    variants and see the GPU."""
    if not HAS_CUDA or request.node.get_closest_marker("cuda") is not None:
        return
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # `import amdsmi` raises ImportError
    try:
        import pynvml
    except ImportError:
        return

    def no_nvml(*args, **kwargs):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_nvml)


@pytest.fixture(autouse=True, scope="session")
def _peak_cache(tmp_path_factory):
    """Training runs measure this CPU's GEMM peak once and cache it (hardware/measured_peak.py):
    in a folder of the test session (inherited by CLI subprocesses), never the user's home."""
    import os

    os.environ["SPEECHPERF_CACHE"] = str(tmp_path_factory.mktemp("speechperf-cache"))


TINY_HOURS = 0.03  # about a hundred short train utterances: seconds to synthesize and prepare
TINY_SEED = 3  # the tiny corpus's voices and sentences (tests/corpus/test_synth.py synthesizes it again)


def shared_folder(tmp_path_factory, name: str, build):
    """A session folder built once per test run: under pytest-xdist every worker would build its
    own (a tiny corpus costs ~35 s); the first worker builds it under a file lock in the run's
    common temporary folder, the others wait and read it. Tests only read these folders."""
    import os

    from filelock import FileLock  # torch's own dependency

    if not os.environ.get("PYTEST_XDIST_WORKER"):  # no xdist: this process is the whole run
        folder = tmp_path_factory.mktemp(name)
        build(folder)
        return folder
    folder = tmp_path_factory.getbasetemp().parent / f"shared-{name}"
    built = folder.with_name(f"{folder.name}.built")  # beside it: nothing foreign inside the folder
    with FileLock(f"{folder}.lock"):
        if not built.exists():
            folder.mkdir(exist_ok=True)
            build(folder)
            built.touch()
    return folder


def prepared_files(folder: Path) -> dict[Path, bytes]:
    """Every file of a features folder by its relative path, with its bytes, less the word LM a
    decoder caches beside the features (data/lm.py: lm.json, lm.arpa): the shared tiny features
    hold it once any test has decoded with it, and prepare writes none (a prepare compared with
    them file for file)."""
    from speechperf.decode.flashlight import ARPA_NAME
    from speechperf.data.lm import LM_NAME

    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.relative_to(folder) not in (Path(LM_NAME), Path(ARPA_NAME))}


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory):
    from speechperf.corpus.synth import synthesize

    return shared_folder(tmp_path_factory, "corpus",
                   lambda root: synthesize(root, hours=TINY_HOURS, seed=TINY_SEED, progress=False))


@pytest.fixture(scope="session")
def tiny_features(tiny_corpus, tmp_path_factory):
    from speechperf.features.prepare import prepare

    return shared_folder(tmp_path_factory, "features",
                   lambda out: prepare(tiny_corpus, out, progress=False, workers=1))


def cli_argv(*args) -> list[str]:
    """The command ``python -m speechperf ARGS``, each argument as text."""
    return [sys.executable, "-m", "speechperf", *map(str, args)]


def cli(*args, timeout: float = 300, check: bool = False, fresh: bool = False, **kwargs) -> subprocess.CompletedProcess:
    """``speechperf ARGS`` in a new process, as a user runs it: its exit status, stdout and stderr
    (``kwargs``: subprocess.run's, e.g. ``cwd``). ``check``: a failure raises, showing both. The
    process is forked from a server that imported torch once (tests/forked_cli.py), or, with
    ``fresh`` or an environment that differs from the server's (but for folders added to
    PYTHONPATH), a fresh ``python -m speechperf``."""
    argv = [*map(str, args)]
    if not fresh and forked_cli.usable(kwargs):
        p = forked_cli.run(argv, timeout, **kwargs)
    else:
        p = subprocess.run(cli_argv(*argv), capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and p.returncode != 0:
        raise AssertionError(f"speechperf {' '.join(map(str, args))} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def cli_start(*args, session: bool = False, fresh: bool = False, env: dict | None = None, module: str = "speechperf"):
    """``speechperf ARGS`` (``python -m MODULE ARGS``: a test's own child module, which wraps the
    CLI) started in the background as cli() starts it (``session``: in its own process group, as
    Slurm starts a job step): a subprocess.Popen, or tests/forked_cli.py's Forked, which answers
    the same calls; stdout is not kept, stderr is ``p.stderr``."""
    argv = [*map(str, args)]
    if not fresh and forked_cli.usable({} if env is None else {"env": env}):
        return forked_cli.Forked(argv, env=env, session=session, module=module)
    return subprocess.Popen([sys.executable, "-m", module, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=session, env=env)


def sigterm_when_ready(p, ready, to_group: bool = True, timeout: float = 120) -> tuple[int, str]:
    """SIGTERM to ``p`` (cli_start's, ``session=True``), or to its process group as Slurm sends it,
    once ``ready()``; (its exit status, its stderr)."""
    deadline = time.time() + timeout
    while time.time() < deadline and p.poll() is None and not ready():
        time.sleep(0.05)
    assert ready(), "the moment to stop it never came"
    if to_group:
        os.killpg(p.pid, signal.SIGTERM)
    else:
        p.send_signal(signal.SIGTERM)
    return p.wait(timeout=timeout), p.stderr.read()


def torchrun_args(*args, procs: int = 2, port: int | None = None) -> list[str]:
    """torchrun's arguments for ``speechperf ARGS`` in ``procs`` processes on this machine."""
    from speechperf.drive.sweep import free_port

    return ["--nproc-per-node", str(procs), "--master-port", str(port or free_port()), "-m", "speechperf",
            *map(str, args)]


def _torchrun_env(env: dict | None) -> dict:
    """The workers' environment: one thread each (two ranks share the worker's cores)."""
    return {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}


def torchrun(*argv, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """``torchrun ARGV`` (``torchrun_args()``, or a launch of its own), as a user runs it, waited
    for: its launcher forked from the preloaded server (tests/forked_cli.py: any environment
    can, the launcher computes nothing), and its workers, which torchrun's agent starts, watches
    and stops itself, forked from the same server where their environment allows (else fresh
    ``python -u -m speechperf`` processes)."""
    return forked_cli.run([*map(str, argv)], timeout, env=_torchrun_env(env), module="torch.distributed.run")


def torchrun_start(*argv, output=None, env: dict | None = None):
    """``torchrun ARGV`` started in the background as torchrun() starts it: a Forked (Popen's
    interface; ``p.workers()``: rank -> pid); stdout and stderr appended to ``output`` when given,
    else ``p.stderr`` and ``p.stdout_text()``."""
    return forked_cli.Forked([*map(str, argv)], env=_torchrun_env(env), module="torch.distributed.run",
                             output=output)


def run_benchmark(*args) -> int:
    """``python benchmarks/run.py ARGS`` in this process (benchmarks/ is no package: its folder
    joins the path); a run that appends to the ledger starts git for the commit it names."""
    bench = str(Path(__file__).resolve().parents[1] / "benchmarks")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import run

    return run.main([*map(str, args)])


# The session's tiny run: two epochs (two evaluations), a checkpoint every 3 steps (their seconds
# show among the time parts), greedy evaluation (seconds); a command continuing it repeats them.
TINY_RUN = ["--preset", "tiny", "threads=1", "max_epochs=2", "checkpoint_every=3", "sentence_every=50",
            "train.eval.decoder=greedy", "train.floor.steps=3"]


@pytest.fixture(scope="session")
def tiny_run(tiny_features, tmp_path_factory):
    """A real finished run folder, trained once per test session by ``speechperf train --data
    TINY_FEATURES --out RUN TINY_RUN``. Tests read it (RunView.open, the reading commands) or copy it
    to change it."""
    def build(folder):
        p = cli("train", "--data", tiny_features, "--out", folder / "run", *TINY_RUN, "--json", timeout=600)
        assert p.returncode == 0, p.stderr

    return shared_folder(tmp_path_factory, "run", build) / "run"


def tone(seconds, rate=16000, f=440.0):
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * f * t) + 0.01 * np.random.default_rng(0).standard_normal(len(t))).astype(np.float32)


@pytest.fixture
def bad_corpus(tmp_path):
    """train-clean/19/198 in the exact LibriSpeech layout: good files and one of each problem."""
    ch = tmp_path / "train-clean" / "19" / "198"
    ch.mkdir(parents=True)
    lines = []
    for i, text in enumerate(["HELLO WORLD", "A COOL DOG'S BONE", "GOOD MORNING TO YOU"]):
        sf.write(ch / f"19-198-{i:04d}.flac", tone(1.0 + i * 0.2, f=300 + 100 * i), 16000)
        lines.append(f"19-198-{i:04d} {text}")
    sf.write(ch / "19-198-0003.flac", tone(1.0), 8000)  # wrong sample rate
    lines.append("19-198-0003 EIGHT KILOHERTZ")
    (ch / "19-198-0004.flac").write_bytes(b"fLaC" + bytes(range(256)) * 4)  # corrupt
    lines.append("19-198-0004 CORRUPT FILE")
    sf.write(ch / "19-198-0005.flac", tone(2.0), 16000)
    data = (ch / "19-198-0005.flac").read_bytes()
    (ch / "19-198-0005.flac").write_bytes(data[: len(data) // 3])  # truncated
    lines.append("19-198-0005 TRUNCATED FILE")
    lines.append("19-198-0006 NO AUDIO FOR THIS LINE")  # transcript without audio
    sf.write(ch / "19-198-0007.flac", tone(1.0), 16000)  # audio without transcript
    sf.write(ch / "19-198-0008.flac", tone(1.0), 16000)
    lines.append("19-198-0008 ROOM 101 IS OPEN")  # characters outside the alphabet
    sf.write(ch / "19-198-0009.flac", tone(1.0), 16000)
    lines.append("19-198-0009 ")  # empty transcript
    sf.write(ch / "19-198-0010.flac", tone(0.05), 16000)
    lines.append("19-198-0010 TOO SHORT")  # 6 frames < 11
    sf.write(ch / "19-198-0011.flac", tone(17.0), 16000)
    lines.append("19-198-0011 TOO LONG")  # > 16.7 s
    lines.append("garbage line without id")
    (ch / "19-198.trans.txt").write_text("\n".join(lines) + "\n")
    return tmp_path
