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
it imports torch for nothing but its agent, so any environment can fork it. Its agent starts
each worker (``python -u -m speechperf``, in a session of its own) through one call,
SubprocessHandler._popen, which the forked launcher answers with a fork from the same server
where the worker's environment allows (torchrun's own variables are read when used), else with
torchrun's Popen; the agent polls, signals (os.killpg) and waits on it as on its Popen. A worker
is then the server's child, not the launcher's: the launcher notes each worker's rank and pid
(``Forked.workers()``)."""
from __future__ import annotations

import atexit
import io
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

# What a command imports before it works: imported once in the server, inherited by every fork.
# The server imports nothing that starts threads or touches a device (a fork after either is unsafe).
PRELOAD = ["torch", "torch._dynamo", "speechperf.cli", "speechperf.train.loop", "speechperf.studies.tta"]
# Variables a library reads when it loads (OpenMP, MKL, oneDNN, ATen's dispatch, torch, CUDA and
# ROCm, the dynamic loader, the allocator, Python itself): a server that loaded with other values
# cannot stand for a fresh process. Others are read when used, in the child, from the caller's
# environment.
LOAD_TIME = ("OMP_", "MKL_", "KMP_", "GOMP_", "ATEN_", "ONEDNN_", "DNNL_", "TORCH", "PYTORCH_", "CUDA_", "HIP_",
             "ROCR_", "ROCM_", "LD_", "MALLOC_", "OPENBLAS_", "NUMBA_", "PYTHON")
# Those of them read when used, which torch sets itself: the compile cache (in a process that
# compiles) and torchrun's agent's variables for a worker (restart count, run id, NCCL's errors).
READ_WHEN_USED = ("TORCHINDUCTOR_CACHE_DIR", "TORCHELASTIC_", "TORCH_NCCL_ASYNC_ERROR_HANDLING")
_context = None
_started_with: dict | None = None  # the environment the server started with (this process's, then)
_launcher: dict = {}  # in a forked torchrun launcher: its output files and where it notes its workers


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
    changed = {k for k in {*env, *started} if env.get(k) != started.get(k)} - {"PYTHONPATH"}
    loaded = any(k.startswith(LOAD_TIME) and not k.startswith(READ_WHEN_USED) for k in changed)
    return not loaded and set(_paths(started)) <= set(_paths(env))


def _server():
    global _context, _started_with
    if _context is None:  # the server starts at the first Process.start, from this environment
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
        _started_with = dict(os.environ)
    return _context


def _join_server(started_with: dict) -> None:
    """In a process forked from the server: start processes from that same server. Its address
    and the pipe that keeps it alive are inherited (multiprocessing.forkserver's own globals);
    multiprocessing, which did not start it here, would start a second one (ensure_running
    knows a server by its pid, of which only the starting process can be the parent)."""
    from multiprocessing import forkserver, resource_tracker

    global _context, _started_with
    _context, _started_with = multiprocessing.get_context("forkserver"), started_with
    forkserver._forkserver.ensure_running = resource_tracker.ensure_running


def _worker_popen(handler, args: tuple, env: dict):
    """torchrun's SubprocessHandler._popen in a forked launcher: the worker ``python -u -m MODULE
    ARGS`` forked from the server in a session of its own (torchrun's start_new_session), its
    output in the handler's files or the launcher's; torchrun's own Popen where the worker's
    environment differs from the server's in a variable read at load time. Its rank and pid are
    appended to the launcher's notes either way."""
    exe, *rest = args
    if exe == sys.executable and rest[:2] == ["-u", "-m"] and usable({"env": env}):
        files = [f.name if f else own for f, own in ((handler._stdout, _launcher["out"]),
                                                   (handler._stderr, _launcher["err"]))]
        p = Forked(rest[3:], env=env, session=True, module=rest[2], files=files, unbuffered=True)
    else:
        p = _launcher["popen"](handler, args, env)
    with open(_launcher["workers"], "a") as f:
        f.write(f"{env.get('RANK')} {p.pid}\n")
    return p


def _as_launcher(out: str, err: str, workers: str) -> None:
    """This process is torchrun's launcher: its agent's workers fork (``_worker_popen``)."""
    from torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler import SubprocessHandler

    _launcher.update(out=out, err=err, workers=workers, popen=SubprocessHandler._popen)
    SubprocessHandler._popen = _worker_popen


def _unbuffered() -> None:
    """stdout and stderr written through at once, as ``python -u`` makes them."""
    for name in ("stdout", "stderr"):
        old = getattr(sys, name)
        setattr(sys, name, io.TextIOWrapper(open(old.fileno(), "wb", buffering=0, closefd=False),
                                            encoding=old.encoding, errors=old.errors, write_through=True))


def _child(argv: list[str], cwd: str, env: dict, out: str, err: str, session: bool, module: str,
           started_with: dict, unbuffered: bool, workers: str | None) -> None:
    """In the forked process: the caller's folder, environment and output files (``session``:
    its own process group, as Popen's start_new_session; ``unbuffered``: as ``python -u``), then
    ``python -m MODULE ARGV``'s __main__ (its SystemExit is the status; an uncaught exception is
    printed and exits 1, as the interpreter does). ``workers``: this is torchrun's launcher, which
    notes its workers there."""
    if session:
        os.setsid()
    # multiprocessing made this process its child: make it a main process again, whose
    # multiprocessing starts its own children by fork (the DataLoader's readers), as a fresh one's does
    multiprocessing.current_process().name = "MainProcess"
    multiprocessing.process._parent_process = None
    multiprocessing.set_start_method(None, force=True)
    _join_server(started_with)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.path[1:1] = [p for p in _paths(env) if p not in sys.path]  # where a fresh interpreter puts PYTHONPATH
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_APPEND)  # out and err may be one file
        os.dup2(target, fd)
        os.close(target)
    if unbuffered:
        _unbuffered()
    if workers:
        _as_launcher(out, err, workers)
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


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except ProcessLookupError:
        return None


class Forked:
    """A started ``speechperf ARGV`` (``module``: another ``python -m MODULE``), with the part of
    subprocess.Popen's interface the tests and torchrun's agent use: ``pid``, ``poll``, ``wait``,
    ``send_signal``, ``kill``, ``returncode`` and ``stderr``, a file of what it wrote there so far
    (its stdout is kept too: ``stdout_text``). ``output``: a file both are appended to instead
    (Popen's ``stdout=open(output, "a"), stderr=STDOUT``); ``files``: two files, stdout's and
    stderr's. A torchrun launcher notes its workers' pids (``workers``)."""

    def __init__(self, argv: list[str], cwd=None, env: dict | None = None, session: bool = False,
                 module: str = "speechperf", output: str | os.PathLike | None = None,
                 files: list[str] | None = None, unbuffered: bool = False):
        self.args = [module, *argv]
        if files is not None:
            self._out, err = map(Path, files)
        else:
            self._tmp = tempfile.TemporaryDirectory(prefix="forked-cli-")
            self._out, err = Path(self._tmp.name, "stdout"), Path(self._tmp.name, "stderr")
        if output is not None:
            self._out = err = Path(output)
        self._out.touch()
        err.touch()
        self._workers = None
        if module == "torch.distributed.run":
            self._workers = Path(self._tmp.name, "workers")
            self._workers.touch()
        server = _server()
        self._p = server.Process(target=_child, args=(argv, str(Path(cwd or os.getcwd()).resolve()),
                                                      dict(os.environ if env is None else env), str(self._out),
                                                      str(err), session, module, _started_with, unbuffered,
                                                      self._workers and str(self._workers)))
        self._p.start()
        self.pid, self.returncode = self._p.pid, None
        while session and self.poll() is None and _session(self.pid) != self.pid:
            time.sleep(0.001)  # Popen returns once its child leads its session (os.killpg finds it)
        self.stderr = open(err, encoding="utf-8")

    def workers(self) -> dict[int, int]:
        """A torchrun launcher's workers so far: rank -> pid of the latest started (a restarted
        group's)."""
        lines = self._workers.read_text().split() if self._workers else []
        return {int(rank): int(pid) for rank, pid in zip(lines[::2], lines[1::2])}

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


def _traced(rank: int, fn, stacks: str, *args) -> None:
    """``fn(rank, *args)``, its threads' stacks written to ``stacks.RANK`` on SIGUSR1 (faulthandler)."""
    import faulthandler

    with open(f"{stacks}.{rank}", "w") as f:
        faulthandler.register(signal.SIGUSR1, file=f, all_threads=True)
        fn(rank, *args)


def start_processes(fn, args: tuple, nprocs: int, deadline: float = 240.0) -> None:
    """``torch.multiprocessing.spawn(fn, args, nprocs)``, its processes forked from the server
    instead of spawned: ``fn(rank, *args)`` in each (``fn`` a module-level function, which the
    child imports), from the environment the server started with, torch already imported (a
    spawned process pays 2-3 s of CPU for it); joined, a failed process raising as spawn's does.

    Processes not done after ``deadline`` seconds (the suite's take 1-10) are a hang: each one's
    Python stacks are taken (SIGUSR1), they are killed, and TimeoutError names the function and
    shows the stacks. Without it a hung rank waited out pytest's timeout, which killed the whole
    xdist worker and said only that it crashed (a CI run's gloo test did; :func:`in_group` is why)."""
    import torch.multiprocessing as torch_mp

    _server()  # the preloads set before the server starts
    with tempfile.TemporaryDirectory(prefix="forked-ranks-") as tmp:
        stacks = os.path.join(tmp, "stacks")
        ctx = torch_mp.start_processes(_traced, args=(fn, stacks, *args), nprocs=nprocs, join=False,
                                       start_method="forkserver")
        end = time.monotonic() + deadline
        while not ctx.join(timeout=max(end - time.monotonic(), 0.01)):
            if time.monotonic() >= end:
                raise TimeoutError(f"{fn.__module__}.{fn.__name__}: {nprocs} processes not done after "
                                   f"{deadline:.0f} s; their stacks:\n{_stacks_then_kill(ctx.processes, stacks)}")


def in_group(rank: int, world: int, port: int, work, *args) -> None:
    """``work(rank, *args)`` in a gloo group of ``world`` ranks (127.0.0.1:``port``) at one thread, for
    :func:`start_processes`' workers; the group is closed once ``work``'s frame, and every DDP or FSDP
    model it made, is gone. Why: DDP's C++ reducer holds the group, and a group destroyed while a
    DDP model lived was freed later by the reducer's destructor, which joined gloo's thread while
    holding the GIL; that thread, freeing the barrier's work, waited for the GIL: a deadlock, about
    one in 275 runs of the 2-rank tests under load (py-spy's native stacks: ~ProcessGroupGloo in
    std::thread::join on the main thread, ~AsyncBarrierWork in gil_scoped_acquire on gloo's).
    Freed from Python (destroy_process_group) the group's destructor releases the GIL; the
    training loop drops its model first for the same reason (train/loop.py)."""
    import gc

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    work(rank, *args)
    gc.collect()  # a model in a reference cycle goes now, not when the collector next runs
    dist.barrier()  # tear down together (a rank leaving early can abort gloo's threads)
    dist.destroy_process_group()


def _stacks_then_kill(processes, stacks: str) -> str:
    """Each live process's threads' stacks (SIGUSR1 to :func:`_traced`'s faulthandler), then killed."""
    for p in processes:
        if p.is_alive():
            os.kill(p.pid, signal.SIGUSR1)
    time.sleep(2)  # faulthandler writes from its signal handler at once; the rest is margin for a busy machine
    for p in processes:
        p.kill()
        p.join()
    found = [Path(f"{stacks}.{rank}") for rank in range(len(processes))]
    return "\n".join(f"rank {rank}:\n{(f.read_text() if f.exists() else '') or '(ended)'}" for rank, f in enumerate(found))
