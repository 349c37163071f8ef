"""Decoding on a pool of threads gives the one-thread decode's text, in order."""
import threading
import time

import numpy as np
import pytest

from speechperf.decode import DecodeError, get_decoder
from speechperf.decode import batch as batch_mod
from speechperf.decode.batch import DecodePool, auto_threads, decode_parallel
from speechperf.decode.wordbeam import MODES, WordBeamDecoder
from speechperf import cpus
from tests.decode.test_decoders import TEXTS, lm_of, spell


def batches(noise: float = 1.5, per_batch: int = 4, seed: int = 0) -> list[tuple[np.ndarray, list[int]]]:
    """Padded (T, B, 30) float32 batches of noisy matrices (the search has work to do), as
    evaluate hands them over: 20 utterances in batches of ``per_batch``."""
    texts = [TEXTS[i % len(TEXTS)] for i in range(20)]
    mats = [spell(t, noise=noise, seed=seed + i) for i, t in enumerate(texts)]
    out = []
    for s in range(0, len(mats), per_batch):
        group = mats[s: s + per_batch]
        T = max(len(m) for m in group) + 3
        x = np.full((T, len(group), 30), np.log(1e-6), dtype=np.float32)  # padding past each length
        for b, m in enumerate(group):
            x[: len(m), b] = m
        out.append((x, [len(m) for m in group]))
    return out


def decoders():
    lm = lm_of()
    return [get_decoder("greedy"), get_decoder("beam", beam=8)] + [WordBeamDecoder(lm, beam=8, mode=m, samples=2)
                                                                   for m in MODES]


def pooled(dec, threads: int, data) -> list[str]:
    with DecodePool(dec, threads) as pool:
        for x, lens in data:
            pool.submit(x, lens)
        return pool.results()


@pytest.mark.parametrize("dec", decoders(), ids=lambda d: f"{d.name}:{getattr(d, 'mode', '')}")
def test_n_threads_decode_the_one_thread_text_in_order(dec):
    data = batches()
    serial = [dec.decode(np.ascontiguousarray(x[:n, b])) for x, lens in data for b, n in enumerate(lens)]
    assert len(set(serial)) > 3  # different texts: an order mix-up would show
    assert pooled(dec, 1, data) == serial
    for threads in (2, 4, 7):
        assert pooled(dec, threads, data) == serial
    assert decode_parallel(dec, *data[0], workers=3) == serial[:4]


def test_results_can_be_taken_batch_by_batch_and_frames_are_counted():
    dec, data = get_decoder("beam", beam=8), batches()
    with DecodePool(dec, 3) as pool:
        pool.submit(*data[0])
        first = pool.results()
        pool.submit(*data[1])
        assert first + pool.results() == pooled(dec, 1, data[:2])
        assert pool.frames == sum(data[0][1]) + sum(data[1][1])


def test_the_kernel_releases_the_gil():
    from speechperf.decode import kernel

    for f in (kernel.beam_search, kernel._select, kernel._best, kernel._forecast, kernel._prob, kernel.log_add):
        assert f.targetoptions.get("nogil") is True, f.py_func.__name__


class _OneAtATime:
    """A decoder that must not be entered twice at once (as flashlight's): it counts how many
    threads are inside it."""

    name, thread_safe = "one-at-a-time", False

    def __init__(self):
        self.inside, self.most, self.guard = 0, 0, threading.Lock()

    def decode(self, lp):
        with self.guard:
            self.inside += 1
            self.most = max(self.most, self.inside)
        time.sleep(0.002)
        with self.guard:
            self.inside -= 1
        return str(len(lp))


def test_a_decoder_that_is_not_thread_safe_is_entered_by_one_thread_at_a_time():
    dec, data = _OneAtATime(), batches()
    assert pooled(dec, 4, data) == [str(n) for _, lens in data for n in lens]
    assert dec.most == 1


def test_bad_threads_shapes_and_a_failed_decode_are_errors():
    dec = get_decoder("beam", beam=4)
    with pytest.raises(DecodeError, match="threads must be an integer >= 1"):
        DecodePool(dec, 0)
    with DecodePool(dec, 2) as pool:
        with pytest.raises(DecodeError, match=r"\(T, B, C\)"):
            pool.submit(np.zeros((5, 30), np.float32), [5])
        pool.submit(np.ones((5, 2, 30), np.float32), [5, 5])  # logits, not log-probabilities
        with pytest.raises(DecodeError, match="logits"):
            pool.results()


def test_auto_threads_are_the_usable_cpus_less_the_readers_but_at_least_half(monkeypatch):
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5}, raising=False)
    assert cpus.usable_cpus() == 6
    assert auto_threads(2) == 4
    assert auto_threads(0) == 6
    assert auto_threads(4) == auto_threads(9) == 3  # readers beyond half the cores take no more from the decode
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert auto_threads(8) == 8  # a 16-core GPU host with a GPU preset's 8 readers: as before
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert auto_threads(1) == 1  # never none


# ---- batches still arriving from the device ---------------------------------------------------


class _Gate:
    """A fake CUDA event on the CPU: ``synchronize`` blocks until the test opens the gate (the
    device-to-host copy finished), counting the threads that waited."""

    def __init__(self):
        self.opened, self.guard, self.waited = threading.Event(), threading.Lock(), 0

    def synchronize(self):
        with self.guard:
            self.waited += 1
        assert self.opened.wait(timeout=30), "the gate was never opened"


class _Counting:
    """``dec`` with its calls counted: a decode started before the gate opened would show."""

    def __init__(self, dec):
        self.dec, self.calls = dec, 0
        self.name, self.batched = dec.name, getattr(dec, "batched", False)

    def decode(self, lp):
        self.calls += 1
        return self.dec.decode(lp)

    def decode_batch(self, lp, lens):
        self.calls += 1
        return self.dec.decode_batch(lp, lens)


@pytest.mark.parametrize("name", ["greedy", "beam"])  # one task per batch; one per utterance
def test_a_pending_batch_is_decoded_after_its_event_and_gives_the_synchronous_text(name):
    dec, data = _Counting(get_decoder(name, beam=8)), batches()
    serial = [dec.dec.decode(np.ascontiguousarray(x[:n, b])) for x, lens in data for b, n in enumerate(lens)]
    arriving = [np.full(x.shape, np.nan, np.float32) for x, _ in data]  # the copies' pinned buffers, not filled yet
    gates = [_Gate() for _ in data]
    with DecodePool(dec, 3) as pool:
        t = time.perf_counter()
        for buf, gate, (_, lens) in zip(arriving, gates, data):
            pool.submit(batch_mod.Pending(buf, gate), lens)
        assert time.perf_counter() - t < 1.0  # submit returned without waiting for the gates
        time.sleep(0.2)
        assert dec.calls == 0 and gates[0].waited >= 1  # the threads wait on the event, decoding nothing
        for buf, gate, (x, _) in zip(arriving, gates, data):
            buf[...] = x  # the copy lands, then its event fires
            gate.opened.set()
        assert pool.results() == serial
    per_batch = 1 if dec.batched else 4
    assert [g.waited for g in gates] == [per_batch] * len(data)  # every task waited on its own batch's event


def test_a_pending_batch_of_the_wrong_shape_is_refused_at_submit():
    gate = _Gate()
    with DecodePool(get_decoder("beam", beam=4), 2) as pool:
        with pytest.raises(DecodeError, match=r"\(T, B, C\)"):
            pool.submit(batch_mod.Pending(np.zeros((5, 30), np.float32), gate), [5])
        with pytest.raises(DecodeError, match="B lengths"):
            pool.submit(batch_mod.Pending(np.zeros((5, 2, 30), np.float32), gate), [5])
    assert gate.waited == 0


class _Timed:
    """A decoder whose every call sleeps ``sleep`` wall seconds (off the CPU), then spins ``spin``
    CPU seconds."""

    name = "timed"

    def __init__(self, sleep: float, spin: float):
        self.sleep, self.spin = sleep, spin

    def decode(self, lp):
        time.sleep(self.sleep)
        end = time.thread_time() + self.spin
        while time.thread_time() < end:
            pass
        return "x"


@pytest.mark.parametrize("sleep,spin", [(0.03, 0.0), (0.0, 0.03)])
def test_the_pool_counts_thread_seconds_inside_the_decoder_and_their_cpu_seconds(sleep, spin):
    data, gate = batches()[:2], _Gate()  # 8 utterances
    with DecodePool(_Timed(sleep, spin), 2) as pool:
        pool.submit(batch_mod.Pending(data[0][0], gate), data[0][1])
        pool.submit(*data[1])
        time.sleep(0.3)  # both threads wait on the first batch's event: no decoder time
        gate.opened.set()
        assert pool.results() == ["x"] * 8
    each = sleep + spin
    assert pool.cpu_s >= 8 * spin * 0.99 and pool.busy_s >= pool.cpu_s
    if spin == 0:  # a sleeping decode is wall time off the CPU, and the 2 x 0.3 s of waiting is not counted
        assert 8 * each <= pool.busy_s < 8 * each + 0.25 and pool.cpu_s < 0.05
