"""``speechperf ARGS`` in a new process forked from a server that imported torch and the package
once: multiprocessing's forkserver, for conftest's ``cli()``. A fresh interpreter spends 2-4 s
of CPU importing torch and torch._dynamo (torch's optimizer imports it) before a tiny command
does anything (a tiny training: 1.4-1.9 s forked, 5.9-7.4 s fresh, on a 2-core Xeon), and the
slow tier runs about a hundred such commands.

The child is a new process as a user's is: its own pid, signal handlers, threads and exit status,
stdout and stderr in their own files, the caller's environment and working folder, and it runs
speechperf/__main__.py as ``python -m speechperf`` does (``runpy``), atexit handlers included;
its own children (the loader's readers) are forked from it, as a fresh process's are. Two
things it cannot be, and where they matter a call runs a fresh interpreter instead: a process
whose libraries loaded with other variables (OMP_NUM_THREADS, the ISA caps: ``LOAD_TIME``; a
folder added to PYTHONPATH is put on the child's path), and a first import of the package (an
import error or circle the preloaded server would hide: ``cli(..., fresh=True)``, as the
end-to-end test runs each command's first call). Its sys.path is the test process's, plus PYTHONPATH's additions.

torchrun's launcher (``torch.distributed.run``, conftest's ``torchrun()``) forks the same way:
it imports torch for nothing but its agent, and each of its workers is a fresh ``python -m
speechperf`` that it starts itself, from the environment it was given, so any environment can
fork it."""
from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

# What a command imports before it works: imported once in the server, inherited by every fork.
# The server imports nothing that starts threads or touches a device (a fork after either is unsafe).
PRELOAD = ["torch", "torch._dynamo", "speechperf.cli", "speechperf.train.loop", "speechperf.studies.tta"]
# Variables a library reads when it loads (OpenMP, MKL, oneDNN, ATen's dispatch, torch, CUDA and
# ROCm, the dynamic loader, the allocator, Python itself): a server that loaded with other values
# cannot stand for a fresh process. Others are read when used, in the child, from the caller's
# environment; torch sets TORCHINDUCTOR_CACHE_DIR itself in a process that compiles.
LOAD_TIME = ("OMP_", "MKL_", "KMP_", "GOMP_", "ATEN_", "ONEDNN_", "DNNL_", "TORCH", "PYTORCH_", "CUDA_", "HIP_",
             "ROCR_", "ROCM_", "LD_", "MALLOC_", "OPENBLAS_", "NUMBA_", "PYTHON")
SET_BY_TORCH = frozenset({"TORCHINDUCTOR_CACHE_DIR"})
_context = None
_started_with: dict | None = None  # the environment the server started with (this process's, then)


def _paths(env) -> list[str]:
    return [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def usable(kwargs: dict) -> bool:
    """Whether a call with subprocess.run's ``kwargs`` can fork from the server: no keyword but
    ``cwd`` and ``env``, and no variable read at load time other than in the environment the
    server started with (or will start with: this one), but for folders added to PYTHONPATH
    (the child puts them on its path)."""
    if not set(kwargs) <= {"cwd", "env"}:
        return False
    env = kwargs.get("env", os.environ)
    started = os.environ if _started_with is None else _started_with
    changed = {k for k in {*env, *started} if env.get(k) != started.get(k)} - SET_BY_TORCH - {"PYTHONPATH"}
    return not any(k.startswith(LOAD_TIME) for k in changed) and set(_paths(started)) <= set(_paths(env))


def _server():
    global _context, _started_with
    if _context is None:  # the server starts at the first Process.start, from this environment
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
        _started_with = dict(os.environ)
    return _context


def _child(argv: list[str], cwd: str, env: dict, out: str, err: str, session: bool, module: str) -> None:
    """In the forked process: the caller's folder, environment and output files (``session``:
    its own process group, as Popen's start_new_session), then ``python -m MODULE ARGV``'s
    __main__ (its SystemExit is the status; an uncaught exception is printed and exits 1, as
    the interpreter does)."""
    if session:
        os.setsid()
    # multiprocessing made this process its child: make it a main process again, whose
    # multiprocessing starts its own children by fork (the DataLoader's readers), as a fresh one's does
    multiprocessing.current_process().name = "MainProcess"
    multiprocessing.process._parent_process = None
    multiprocessing.set_start_method(None, force=True)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.path[1:1] = [p for p in _paths(env) if p not in sys.path]  # where a fresh interpreter puts PYTHONPATH
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_APPEND)  # out and err may be one file
        os.dup2(target, fd)
        os.close(target)
    sys.argv = ["-m", *argv]  # runpy puts the module's path first, as -m does
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except Exception:  # not multiprocessing's report ("Process ...:"): the interpreter's
        traceback.print_exc()
        raise SystemExit(1) from None
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        atexit._run_exitfuncs()  # a fresh interpreter runs them at exit; multiprocessing's child does not


class Forked:
    """A started ``speechperf ARGV`` (``module``: another ``python -m MODULE``), with the part of
    subprocess.Popen's interface the tests use: ``pid``, ``poll``, ``wait``, ``send_signal``,
    ``kill``, ``returncode`` and ``stderr``, a file of what it wrote there so far (its stdout is
    kept too: ``stdout_text``). ``output``: a file both are appended to instead (Popen's
    ``stdout=open(output, "a"), stderr=STDOUT``)."""

    def __init__(self, argv: list[str], cwd=None, env: dict | None = None, session: bool = False,
                 module: str = "speechperf", output: str | os.PathLike | None = None):
        self.args = [module, *argv]
        self._tmp = tempfile.TemporaryDirectory(prefix="forked-cli-")
        self._out, err = Path(self._tmp.name, "stdout"), Path(self._tmp.name, "stderr")
        if output is not None:
            self._out = err = Path(output)
        self._out.touch()
        err.touch()
        self._p = _server().Process(target=_child, args=(argv, str(Path(cwd or os.getcwd()).resolve()),
                                                         dict(os.environ if env is None else env), str(self._out),
                                                         str(err), session, module))
        self._p.start()
        self.pid, self.returncode = self._p.pid, None
        self.stderr = open(err, encoding="utf-8")

    def poll(self) -> int | None:
        if self.returncode is None and not self._p.is_alive():
            self.returncode = self._p.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._p.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def stdout_text(self) -> str:
        return self._out.read_text()

    def __del__(self):
        self.stderr.close()


def run(argv: list[str], timeout: float, cwd=None, env: dict | None = None,
        module: str = "speechperf") -> subprocess.CompletedProcess:
    """``speechperf ARGV`` (``python -m MODULE ARGV``) forked from the server, waited for up to
    ``timeout`` seconds (killed then, raising subprocess.TimeoutExpired as subprocess.run does)."""
    p = Forked(argv, cwd, env, module=module)
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise subprocess.TimeoutExpired(p.args, timeout, p.stdout_text(), p.stderr.read()) from None
    return subprocess.CompletedProcess(p.args, p.returncode, p.stdout_text(), p.stderr.read())


def start_processes(fn, args: tuple, nprocs: int) -> None:
    """``torch.multiprocessing.spawn(fn, args, nprocs)``, its processes forked from the server
    instead of spawned: ``fn(rank, *args)`` in each (``fn`` a module-level function, which the
    child imports), from the environment the server started with, torch already imported (a
    spawned process pays 2-3 s of CPU for it); joined, a failed process raising as spawn's does."""
    import torch.multiprocessing as torch_mp

    _server()  # the preloads set before the server starts
    torch_mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")
