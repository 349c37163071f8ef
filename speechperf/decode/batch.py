"""Decoding batches on a pool of threads, beside the forward pass that produces them.

Evaluation is dominated by decoding, and the beam search kernel (decode/kernel.py) is
compiled with ``nogil``: threads of this one process decode utterances in parallel, sharing
the decoder's dictionary and LM tables (read only) with nothing copied or pickled. A batch's
utterances are submitted as separate tasks, so threads stay balanced within a batch, and
:meth:`DecodePool.submit` returns at once: the caller runs the next batch's forward pass
while the previous batches decode. :meth:`DecodePool.results` hands the texts back in
submission order, so the output equals a one-thread decode's text for text (tested).

A decoder that is not safe to call from several threads at once (``thread_safe = False``:
flashlight's decoder keeps per-search state) is called under a lock; a decoder that decodes a
whole batch at once (``batched = True``: greedy's vectorized argmax) gets one task per batch.

A batch may be submitted before its values exist (:class:`Pending`: a host buffer that a
device-to-host copy is still filling, and the event recorded after that copy): the decode
threads wait on the event, so the caller launches the next forward pass without waiting for
the device.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from speechperf.cpus import usable_cpus
from speechperf.decode import DecodeError


def auto_threads(reserved: int = 0) -> int:
    """Decode threads for this process: its usable CPUs less ``reserved`` (the loader's reader
    processes, which fill the next batches meanwhile), but at least half of them and at least one:
    the readers fill a bounded buffer and then wait, so they hold their cores for part of an
    evaluation only. A GPU preset's 8 readers on an 8-core host leave 4 threads, not 1 (an
    evaluation decoding on one core was 44% of an H200's time to accuracy)."""
    cpus = usable_cpus()
    return max(1, cpus - max(0, reserved), cpus // 2)


class Pending:
    """A (T, B, C) batch whose values are still arriving: ``array`` (its final shape and
    memory) may be read once ``ready.synchronize()`` has returned (a CUDA event recorded after
    the copy into ``array``; torch's ``Event.synchronize`` releases the GIL while it waits)."""

    def __init__(self, array: np.ndarray, ready):
        self.array, self.ready = array, ready
        self.shape = array.shape

    def get(self) -> np.ndarray:
        """The array, once its copy has finished (every caller waits on the same event)."""
        self.ready.synchronize()
        return self.array


def _arrived(log_probs: np.ndarray | Pending) -> np.ndarray:
    return log_probs.get() if isinstance(log_probs, Pending) else log_probs


class DecodePool:
    """Batches of log-probabilities in, texts out in submission order; ``threads`` decode."""

    def __init__(self, decoder, threads: int):
        if not isinstance(threads, (int, np.integer)) or threads < 1:
            raise DecodeError(f"decode threads must be an integer >= 1, got {threads!r}")
        self.decoder, self.threads = decoder, int(threads)
        self.frames = 0  # valid frames submitted (the decode rate's numerator)
        self.wait_s = 0.0  # wall seconds :meth:`results` waited for decodes still running
        self.busy_s = 0.0  # thread-seconds inside the decoder's calls (a wait for a pending copy or the lock excluded)
        self.cpu_s = 0.0  # CPU seconds of those calls (their threads' time.thread_time): below busy_s where a
        # thread waited for a core or the GIL, so cpu_s / busy_s is how much of a core each decode had
        self._lock = None if getattr(decoder, "thread_safe", True) else threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []  # one per utterance, or per batch for a batched decoder

    def submit(self, log_probs: np.ndarray | Pending, lens) -> None:
        """Start decoding a (T, B, C) batch with valid lengths (B,); returns at once, without
        waiting for a :class:`Pending` batch (its threads do). The array must not be written to
        afterwards (its utterances are read by the threads)."""
        if len(log_probs.shape) != 3 or len(lens) != log_probs.shape[1]:
            raise DecodeError(f"expected (T, B, C) log-probs with B lengths, got {log_probs.shape} and {len(lens)}")
        lens = [int(n) for n in lens]
        self.frames += sum(lens)
        if self._executor is None:  # started on first use: after the loader has forked its readers
            self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="speechperf-decode")
        if getattr(self.decoder, "batched", False):
            self._pending.append(self._executor.submit(self._batch, log_probs, lens))
            return
        for b, n in enumerate(lens):
            self._pending.append(self._executor.submit(self._one, log_probs, b, n))

    def done(self, texts: list[str], frames: int, busy_s: float, cpu_s: float) -> None:
        """Texts decoded already, by a search that needs the model (a transducer's, on its device),
        taken in submission order with the seconds and CPU seconds they took."""
        finished: Future = Future()
        finished.set_result((list(texts), busy_s, cpu_s))
        self.frames += int(frames)
        self._pending.append(finished)

    def _batch(self, log_probs: np.ndarray | Pending, lens: list[int]) -> tuple[list[str], float, float]:
        arrived = _arrived(log_probs)
        return _timed(lambda: self.decoder.decode_batch(arrived, lens))

    def _one(self, log_probs: np.ndarray | Pending, b: int, n: int) -> tuple[list[str], float, float]:
        lp = _arrived(log_probs)[:n, b]  # (T_b, C) view
        if self._lock is None:
            return _timed(lambda: [self.decoder.decode(lp)])
        with self._lock:
            return _timed(lambda: [self.decoder.decode(lp)])

    def results(self) -> list[str]:
        """Every submitted utterance's text, in submission order, waiting for those still
        decoding (a decode's error is raised here); the pool can take new batches after."""
        t = time.perf_counter()
        try:
            done = [f.result() for f in self._pending]
        finally:
            self.wait_s += time.perf_counter() - t
            self._pending = []
        self.busy_s += sum(wall for _, wall, _ in done)
        self.cpu_s += sum(cpu for _, _, cpu in done)
        return [text for texts, _, _ in done for text in texts]

    def close(self) -> None:
        """Stop the threads (decodes not yet started are cancelled)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        self._pending = []

    def __enter__(self) -> DecodePool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _timed(decode) -> tuple[list[str], float, float]:
    """``decode()``'s texts, its wall seconds and its thread's CPU seconds."""
    wall, cpu = time.perf_counter(), time.thread_time()
    texts = decode()
    return texts, time.perf_counter() - wall, time.thread_time() - cpu


def decode_parallel(decoder, log_probs: np.ndarray, lens, workers: int = 0) -> list[str]:
    """(T, B, C) log-probs with valid lengths (B,) -> texts; ``workers`` > 1 decodes on that
    many threads, else in the calling thread."""
    if log_probs.ndim != 3 or len(lens) != log_probs.shape[1]:
        raise DecodeError(f"expected (T, B, C) log-probs with B lengths, got {log_probs.shape} and {len(lens)}")
    if workers <= 1 or len(lens) < 2:
        return [decoder.decode(np.ascontiguousarray(log_probs[: int(n), b])) for b, n in enumerate(lens)]
    with DecodePool(decoder, min(workers, len(lens))) as pool:
        pool.submit(log_probs, lens)
        return pool.results()
