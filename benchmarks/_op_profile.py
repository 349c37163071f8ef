"""A torch.profiler trace of one phase (training steps, an evaluation pass) as per-step figures.

The phase's steps each run inside a ``record_function`` range named ``MARK``; host events count
where they start inside one of those ranges (any thread: the autograd engine's backward
included), so the profiler's own start and the synchronization that closes the timed window
are left out. Device events count whole: the trace holds only the phase, and every kernel its
steps launched has run by the closing synchronization.

Host syncs are the CUDA runtime calls that block the host until the device catches up
(``SYNCS``, as the profiler names them): a blocking device-to-host copy shows as
``cudaMemcpyAsync`` followed by ``cudaStreamSynchronize``, which is the one counted. Each sync's
site is the outermost aten op around it (the call Python made: ``aten::item``,
``aten::ctc_loss``) and, where another aten op sits inside that one, the innermost too
(``aten::ctc_loss > aten::copy_``).
"""
from __future__ import annotations

from collections import Counter, defaultdict

from torch.autograd import DeviceType

MARK = "speechperf::"  # the prefix of the ranges that delimit the profiled steps
SYNCS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                   "cudaMemcpy2D", "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize"})
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchCooperativeKernel", "cudaGraphLaunch")
NOT_KERNELS = ("Memcpy", "Memset")  # device activity that is a copy or a fill, not a kernel (by name)
NAME_WIDTH = 72  # kernel names (templated C++) are cut to this many characters in the tables


def windows(events) -> list[tuple[float, float]]:
    """(start, end) in microseconds of every ``MARK`` range on the host, in order (on a GPU the
    profiler shows each range on the device's timeline too)."""
    return sorted((e.time_range.start, e.time_range.end) for e in events
                  if e.name.startswith(MARK) and e.device_type == DeviceType.CPU)


def inside(e, spans: list[tuple[float, float]]) -> bool:
    return any(a <= e.time_range.start <= b for a, b in spans)


def host_events(events, spans) -> list:
    """Host (CPU) events that start inside the marked ranges, the ranges themselves left out."""
    return [e for e in events if e.device_type == DeviceType.CPU and not e.name.startswith(MARK) and inside(e, spans)]


def device_events(events) -> list:
    return [e for e in events if e.device_type != DeviceType.CPU]


def is_kernel(e) -> bool:
    """A device event that is a kernel: by the profiler's activity type where it names one (not a
    copy, fill, device-side sync or a range's annotation), else by name."""
    kind = getattr(e, "activity_type", None)  # FunctionEvent of torch 2.11 has none
    if kind is not None:
        return kind == "kernel"
    return not e.name.startswith(NOT_KERNELS + (MARK,))


def aten_chain(e) -> list[str]:
    """The aten ops around ``e``, innermost first (its host parents in the trace's tree)."""
    names, p = [], e.cpu_parent
    while p is not None:
        if p.name.startswith("aten::"):
            names.append(p.name)
        p = p.cpu_parent
    return names


def site(e) -> str:
    """``OUTER > INNER`` aten ops around a runtime call; ``OUTER`` alone where they are one; a call
    made outside every aten op (torch.cuda.synchronize() from Python) says so."""
    chain = aten_chain(e)
    if not chain:
        return "(no aten op)"
    return chain[-1] if len(chain) == 1 else f"{chain[-1]} > {chain[0]}"


def top_level_ops(host: list) -> list:
    """Aten ops with no aten op around them: their inclusive times add up without double counting."""
    return [e for e in host if e.name.startswith("aten::") and not aten_chain(e)]


def ms(us: float) -> float:
    return round(us / 1000.0, 3)


def phase_tables(phase: str, events, steps: int, wall_s: float, ref_s: float, cuda: bool) -> dict:
    """``row`` (:func:`phase_row`), ``syncs`` (:func:`sync_sites`; None on a CPU), ``host ops``
    (:func:`top_host_ops`) and ``kernels`` (:func:`top_kernels`; None on a CPU) of one phase's trace."""
    host, device = host_events(events, windows(events)), device_events(events)
    syncs = [e for e in host if e.name in SYNCS]
    sites = sync_sites(syncs, steps)
    return {"row": phase_row(phase, host, device, syncs, sites, steps, wall_s, ref_s, cuda),
            "syncs": sites if cuda else None, "host ops": top_host_ops(host, steps),
            "kernels": top_kernels(device, steps) if cuda else None}


def phase_row(phase: str, host: list, device: list, syncs: list, sites: list[dict], steps: int, wall_s: float,
              ref_s: float, cuda: bool) -> dict:
    """Per step of ``phase``: the unprofiled and profiled wall time, the host time inside top-level
    aten ops and blocked in syncs, the kernels' device time and its share of the unprofiled wall
    (the profiler lengthens the host's work, not the kernels), kernels, launches, syncs and the
    commonest sync site (``sites``: :func:`sync_sites` of ``syncs``). Device columns are None on a CPU."""
    kernels = [e for e in device if is_kernel(e)]
    kernel_us = sum(e.time_range.elapsed_us() for e in kernels)
    dev = (lambda v: v) if cuda else (lambda v: None)  # noqa: E731
    return {"phase": phase, "unprofiled ms": round(ref_s * 1000, 3), "profiled ms": round(wall_s * 1000, 3),
            "host ops ms": ms(sum(e.time_range.elapsed_us() for e in top_level_ops(host)) / steps),
            "sync wait ms": dev(ms(sum(e.time_range.elapsed_us() for e in syncs) / steps)),
            "kernel ms": dev(ms(kernel_us / steps)),
            "busy %": dev(round(100.0 * kernel_us / 1e6 / steps / ref_s, 1) if ref_s > 0 else None),
            "kernels": dev(round(len(kernels) / steps, 1)),
            "launches": dev(round(sum(e.name.startswith(LAUNCHES) for e in host) / steps, 1)),
            "syncs": dev(round(len(syncs) / steps, 2)),
            "top sync site": dev(f"{sites[0]['site']} ({sites[0]['call']})" if sites else "none")}


def sync_sites(syncs: list, steps: int) -> list[dict]:
    """Syncs per step by (site, runtime call), commonest first (then the longest blocked), with
    the host time they blocked."""
    count, wait = Counter(), defaultdict(float)
    for e in syncs:
        key = (site(e), e.name)
        count[key] += 1
        wait[key] += e.time_range.elapsed_us()
    return [{"site": s, "call": c, "per step": round(n / steps, 2), "wait ms": ms(wait[(s, c)] / steps)}
            for (s, c), n in sorted(count.items(), key=lambda kv: (-kv[1], -wait[kv[0]], kv[0]))]


def top_host_ops(host: list, steps: int, k: int = 12) -> list[dict]:
    """The ``k`` host ops (aten ops and runtime calls) with the most self CPU time per step."""
    self_us, calls = defaultdict(float), Counter()
    for e in host:
        self_us[e.name] += e.self_cpu_time_total
        calls[e.name] += 1
    top = sorted(self_us, key=lambda n: (-self_us[n], n))[:k]
    return [{"op": n, "calls": round(calls[n] / steps, 1), "self ms": ms(self_us[n] / steps)} for n in top]


def top_kernels(device: list, steps: int, k: int = 8) -> list[dict]:
    """The ``k`` kernels with the most device time per step."""
    dur, calls = defaultdict(float), Counter()
    for e in device:
        if is_kernel(e):
            dur[e.name] += e.time_range.elapsed_us()
            calls[e.name] += 1
    top = sorted(dur, key=lambda n: (-dur[n], n))[:k]
    return [{"kernel": n[:NAME_WIDTH], "calls": round(calls[n] / steps, 1), "device ms": ms(dur[n] / steps)}
            for n in top]
