"""The parameter server of the asynchronous algorithms (asgd.py, easgd.py) on
torch.distributed.rpc, beside the run's process group.

Rank 0 hosts the server (and trains like every other rank); every rank reaches it with rpc.
- ASGD (paper 003, Eq. 2): a worker pushes its accumulated update (its parameters minus
  those it last pulled) and pulls the server's model; the server applies each push as it
  arrives, so updates may be stale: it counts by how many other pushes each one was overtaken.
- EASGD (Eq. 9): an elastic exchange, w_i <- w_i - alpha (w_i - w~), w~ <- w~ + alpha (w_i - w~):
  the sum of the two is conserved.
``round_robin`` serves the workers in turn (rank 0, 1, ...): the run is then deterministic
(exact against a serial simulation, and a resumed run equals the uninterrupted one); without
it pushes are served first come, first served.

torch has no parameter server of its own (its rpc tutorial's is an example, not a module),
hence this one.
"""
from __future__ import annotations

import os
import socket
import threading

import torch
import torch.distributed.rpc as rpc

from speechperf.errors import SpeechperfError

SERVER = "ps"
_server: "ParameterServer | None" = None  # rank 0's, reached by the rpc calls of every rank


class ParameterServer:
    """The global model (a flat tensor) and the rules that update it; called through rpc."""

    def __init__(self, params: torch.Tensor, workers: int, alpha: float, round_robin: bool = False):
        self.w = params.clone()
        self.workers, self.alpha, self.round_robin = workers, alpha, round_robin
        self.cond = threading.Condition()
        self.turn, self.version = 0, 0
        self.staleness: list[int] = []

    def _wait_turn(self, rank: int) -> None:
        if self.round_robin:
            self.cond.wait_for(lambda: self.turn == rank)

    def _next(self) -> None:
        self.turn = (self.turn + 1) % self.workers
        self.cond.notify_all()

    def push_pull(self, rank: int, delta: torch.Tensor, seen: int) -> tuple[torch.Tensor, int]:
        """ASGD: apply a worker's update; return the current model and its version."""
        with self.cond:
            self._wait_turn(rank)
            self.w += delta
            self.staleness.append(self.version - seen)
            self.version += 1
            self._next()
            return self.w.clone(), self.version

    def elastic(self, rank: int, local: torch.Tensor) -> torch.Tensor:
        """EASGD: move the centre toward the worker; return alpha (w_i - w~)."""
        with self.cond:
            self._wait_turn(rank)
            diff = self.alpha * (local - self.w)
            self.w += diff
            self.version += 1
            self._next()
            return diff

    def pull(self) -> tuple[torch.Tensor, int]:
        with self.cond:
            return self.w.clone(), self.version

    def restore(self, w: torch.Tensor, version: int) -> None:
        """A checkpoint's server (between synchronizations: nobody's turn is pending)."""
        with self.cond:
            self.w, self.version, self.turn = w.clone(), version, 0


def _call(method: str, *args):
    return getattr(_server, method)(*args)


def call(method: str, *args):
    """``method`` of rank 0's server, from any rank."""
    return rpc.rpc_sync(SERVER, _call, args=(method, *args))


def host(params: torch.Tensor, workers: int, alpha: float, round_robin: bool) -> None:
    """Rank 0: the server, from the common starting model."""
    global _server
    _server = ParameterServer(params, workers, alpha, round_robin)


def staleness() -> list[int]:
    """By how many pushes each ASGD push was overtaken (rank 0)."""
    return list(_server.staleness) if _server is not None else []


def _address() -> tuple[str, int]:
    """Where rank 0 hosts the rpc rendezvous: MASTER_ADDR, the port after MASTER_PORT."""
    return os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500")) + 1


def _port_taken(name: str, addr: str, port: int, why: str) -> SpeechperfError:
    return SpeechperfError(f"algo.name={name}: its parameter server needs port {port} (MASTER_PORT + 1) on {addr}, "
                           f"which is in use ({why}): free it, or give torchrun another --master-port (MASTER_PORT)")


def check_port(name: str) -> None:
    """Rank 0, before the run folder exists: the rendezvous port is free (bound and let go at
    once, as the store binds it), else an error naming it (exit 2), not a raw EADDRINUSE."""
    addr, port = _address()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as e:
            raise _port_taken(name, addr, port, e.strerror or str(e)) from None


def start_rpc(rank: int, world: int) -> None:
    """RPC beside the process group, on the next port (torchrun sets MASTER_ADDR/PORT); once
    per process (rpc cannot start twice)."""
    if rpc.api._is_current_rpc_agent_set():
        return
    addr, port = _address()
    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://{addr}:{port}", rpc_timeout=600)
    # Under torchrun every store is a client of the agent's store, and nobody would serve
    # this port: rank 0 must host the rpc rendezvous itself (hangs otherwise: observed).
    agent = os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    try:
        rpc.init_rpc(SERVER if rank == 0 else f"worker{rank}", rank=rank, world_size=world, rpc_backend_options=opts)
    except RuntimeError as e:  # taken since check_port looked: named all the same
        if "EADDRINUSE" in str(e) or "address already in use" in str(e).lower():
            raise _port_taken("asgd/easgd", addr, port, "EADDRINUSE") from None
        raise
    finally:
        if agent is not None:
            os.environ["TORCHELASTIC_USE_AGENT_STORE"] = agent


def stop_rpc(graceful: bool = True) -> None:
    """End rpc: gracefully, every rank at the end of the run (waiting for every rank's
    outstanding calls); or this rank alone, at once, when its run failed (the others may
    never get there)."""
    if not rpc.api._is_current_rpc_agent_set():
        return
    if graceful:
        rpc.shutdown()
        return
    try:
        rpc.shutdown(graceful=False)
    except Exception:  # noqa: BLE001 (the run's own error is the one raised)
        pass
