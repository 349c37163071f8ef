"""A GPU as the sampler reads it through amdsmi (AMD Instinct under ROCm): the readings of
telemetry/nvml_gpu.py, from amdsmi's documented calls. Every period: power
(``amdsmi_get_power_info``: the instant ``current_socket_power`` where the firmware has it, else
the averaged ``average_socket_power``; ``power_field`` says which), the energy counter
(``amdsmi_get_energy_count``: accumulator x resolution, uJ) and utilization
(``amdsmi_get_gpu_activity``'s ``gfx_activity``, polled: amdsmi keeps no buffer of samples as
NVML does); memory (``amdsmi_get_gpu_vram_usage``, MB) with the buffer drains. amdsmi returns
"N/A" for a reading the firmware lacks; which readings exist is found on first use.

The counter is read as joules since the sampler's first reading, wraps undone (see
:meth:`AmdGpu._joules`), and its first ``CHECK_S`` seconds are held back and compared with the
power readings: amdsmi's counter is known to stand still or run wrong on some boards
(ROCm/amdsmi issues 22 and 38; Zeus checks it the same way), and a refused counter leaves the
energy to the integrated power (telemetry/energy.py's rule), with the reason recorded."""
from __future__ import annotations

import contextlib
import io

from speechperf.telemetry.device_gpus import RunGpu, pci_of_bdf, pick_runs
from speechperf.telemetry.energy import integrate
from speechperf.telemetry.sample import Sample

NA = "N/A"  # amdsmi's value for a reading the firmware does not provide
CHECK_S = 2.0  # s of counter readings compared with the power readings before the counter is trusted
# counter joules / power joules accepted by that check: Zeus's loose bounds, which catch a counter
# standing still or off by its unit, not a counter that updates more coarsely than the power
AGREE = (0.1, 10.0)
MIN_CHECK_J = 1.0  # J of integrated power below which the check cannot tell (no power reading, say)
MAX_W = 3000.0  # W: no accelerator draws more; bounds a counter step that is taken for a wrap


def open_amdsmi(amdsmi, unavailable: dict, indices: list[int] | None = None, run_gpus: list[RunGpu] | None = None):
    """(amdsmi module, [(index, handle), ...]) or None, with the reason in ``unavailable``.
    An index is the GPU's HIP index (torch's ``cuda:N`` on a process that sees every GPU) where
    amdsmi tells it, else its place in amdsmi's list. ``run_gpus``: only these GPUs, by PCI
    address (HIP's UUID is not amdsmi's); where one is not found, every GPU and why, in
    ``unavailable["gpu_selection"]``."""
    try:
        if amdsmi is None:
            # the package prints to stdout when libamd_smi.so is missing, then raises
            with contextlib.redirect_stdout(io.StringIO()):
                import amdsmi
        amdsmi.amdsmi_init(amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS)
        by_index = _by_hip_index(amdsmi, amdsmi.amdsmi_get_processor_handles())
    except Exception as e:  # no ROCm library, no driver, no device
        unavailable["gpu"] = f"amdsmi unavailable ({type(e).__name__}: {e})"
        return None
    if not by_index:
        unavailable["gpu"] = "amdsmi found no GPU"
        return None
    wanted = sorted(by_index) if indices is None else list(indices)
    missing = [i for i in wanted if i not in by_index]
    if missing:
        unavailable["gpu"] = f"amdsmi has GPU(s) {sorted(by_index)}; asked for index(es) {missing}"
        return None
    handles = [(i, by_index[i]) for i in wanted]
    return amdsmi, handles if run_gpus is None else _the_runs(amdsmi, handles, run_gpus, unavailable)


def _the_runs(amdsmi, handles: list, run_gpus: list[RunGpu], unavailable: dict) -> list:
    """The handles at ``run_gpus``' PCI addresses (amdsmi's BDF less its function)."""
    want = None if any(g.pci is None for g in run_gpus) else {g.pci for g in run_gpus}
    return pick_runs(handles, want, lambda h: pci_of_bdf(amdsmi.amdsmi_get_gpu_device_bdf(h)), "amdsmi",
                     ("PCI address", "BDF"), unavailable)


def _by_hip_index(amdsmi, handles: list) -> dict:
    """{HIP index: handle}: amdsmi's own order need not be HIP's (Zeus maps them the same way)."""
    try:
        ids = [amdsmi.amdsmi_get_gpu_enumeration_info(h)["hip_id"] for h in handles]
    except Exception:  # amdsmi before 6.4 lacks the call
        ids = []
    if len(set(ids)) != len(handles) or any(not isinstance(i, int) for i in ids):
        ids = list(range(len(handles)))
    return dict(zip(ids, handles))


def _number(d: dict, key: str) -> float | None:
    """A reading of an amdsmi dict, None where the firmware has none ("N/A", missing key)."""
    v = d.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


class AmdGpu:
    """One amdsmi device: which of its readings exist (found on first use), the counter's running
    joules and the readings held back until the counter is checked."""

    library = "amdsmi"

    def __init__(self, smi, index: int, handle, unavailable: dict):
        self.smi, self.index, self.h, self.unavailable = smi, index, handle, unavailable
        self.source = f"gpu{index}"
        self.instant = self.average = self.counter = self.activity = True  # until amdsmi says otherwise
        self.answered: set[str] = set()  # calls that have worked once
        self.last: tuple[float, float] | None = None  # (t, accumulator ticks) of the previous reading
        self.joules = 0.0  # since the first reading
        self.restarts = 0  # counter steps back that were no wrap
        self.held: list[Sample] = []  # energy readings until the counter is checked
        self.powers: list[tuple[float, float]] = []  # (t, W) beside them, for the check
        self.checked = False

    def power_field(self) -> str:
        return "instant" if self.instant else "average"

    def util_field(self) -> str:
        return "polled"

    def asked(self, interval: float, buffer_interval: float) -> dict[str, float | None]:
        """The period asked of each of its series ("source:metric"); every reading is polled."""
        s = self.source
        out: dict[str, float | None] = {f"{s}:mem_mb": buffer_interval}
        if self.activity:
            out[f"{s}:util_pct"] = interval
        if self.instant or self.average:
            out[f"{s}:power_w" if self.instant else f"{s}:power_avg_w"] = interval
        if self.counter:
            out[f"{s}:energy_j"] = interval
        return out

    def _call(self, name: str, *args):
        """One amdsmi call; None where it failed before ever working (amdsmi lacks it for this
        board). A call that worked before and fails now raises: the device is in trouble."""
        try:
            out = getattr(self.smi, name)(self.h, *args)
        except Exception:
            if name in self.answered:
                raise
            return None
        self.answered.add(name)
        return out

    def tick(self, t: float) -> list[Sample]:
        """The per-period readings: power, the energy counter, utilization."""
        out: list[Sample] = []
        if self.instant or self.average:
            self._power(t, out)
        if self.counter:
            self._energy(t, out)
        if self.activity:
            busy = _number(self._call("amdsmi_get_gpu_activity") or {}, "gfx_activity")
            if busy is None:
                self.activity = False
                self.unavailable.setdefault(f"{self.source}:util", "amdsmi reports no gfx_activity")
            else:
                out.append(Sample(t, self.source, "util_pct", busy))
        return out

    def _power(self, t: float, out: list) -> None:
        info = self._call("amdsmi_get_power_info")
        for metric, key in (("power_w", "current_socket_power"), ("power_avg_w", "average_socket_power")):
            if metric == "power_w" and not self.instant:
                continue
            watts = _number(info or {}, key)
            if watts is not None:
                out.append(Sample(t, self.source, metric, watts))
                if not self.checked:  # kept only for the counter's check
                    self.powers.append((t, watts))
                return
            self.instant = False
        self.average = False
        self.unavailable.setdefault(f"{self.source}:power", "amdsmi_get_power_info failed" if info is None else
                                    "amdsmi reports N/A for current_socket_power and average_socket_power")

    def _energy(self, t: float, out: list) -> None:
        d = self._call("amdsmi_get_energy_count") or {}
        # amdsmi before 6.2.1 named the accumulator "power" (Zeus reads both)
        ticks = _number(d, "energy_accumulator") if "energy_accumulator" in d else _number(d, "power")
        resolution = _number(d, "counter_resolution")
        if ticks is None or not resolution:
            self.counter = False
            self.unavailable.setdefault(f"{self.source}:energy", "amdsmi has no energy counter for this GPU")
            return
        self.joules += self._joules(t, ticks, resolution)
        self.last = (t, ticks)
        sample = Sample(t, self.source, "energy_j", self.joules)
        if self.checked:
            out.append(sample)
            return
        self.held.append(sample)
        if t - self.held[0].t >= CHECK_S:
            out.extend(self.check())

    def _joules(self, t: float, ticks: float, resolution: float) -> float:
        """Joules since the previous reading. The accumulator is 64 bits in amdsmi's API, but
        the firmware counter under it may be narrower: a step back is taken for a wrap at 2^32
        (or 2^64) ticks where that step is one a GPU can draw, else for a counter that started
        again, whose interval is charged nothing and counted (``restarts``)."""
        if self.last is None:
            return 0.0
        t0, prev = self.last
        if ticks >= prev:
            return (ticks - prev) * resolution / 1e6
        span = 2.0 ** 32 if prev < 2 ** 32 else 2.0 ** 64
        wrapped = (ticks + span - prev) * resolution / 1e6
        if wrapped <= MAX_W * max(t - t0, 1e-3):
            return wrapped
        self.restarts += 1
        self.unavailable[f"{self.source}:energy_restarts"] = (
            f"the energy counter went back {self.restarts} time(s), not a wrap (driver reloaded?): "
            "those intervals are not charged")
        return 0.0

    def check(self) -> list[Sample]:
        """The held counter readings once they agree with the integrated power (within
        ``AGREE``); none, and the counter left for good, where they do not. Without enough
        power to compare (no power reading) the counter is taken as it is."""
        self.checked = True
        held, self.held = self.held, []
        counted = held[-1].value - held[0].value if held else 0.0
        start, end = (held[0].t, held[-1].t) if held else (0.0, 0.0)
        powered = integrate([p for p in self.powers if start <= p[0] <= end])
        self.powers = []
        if powered < MIN_CHECK_J or AGREE[0] <= counted / powered <= AGREE[1]:
            return held
        self.counter = False
        self.unavailable[f"{self.source}:energy"] = (
            f"amdsmi's energy counter read {counted:.1f} J where its power read {powered:.1f} J over "
            f"{end - start:.1f} s (ROCm/amdsmi issue 38): energy integrated from power instead")
        return []

    def drain(self, t: float, wall0: float) -> list[Sample]:
        """Memory now (amdsmi keeps no buffered samples to drain)."""
        used = _number(self._call("amdsmi_get_gpu_vram_usage") or {}, "vram_used")
        return [Sample(t, self.source, "mem_mb", used)] if used is not None else []

    def finish(self) -> list[Sample]:
        """At stop: the counter readings still held (a run shorter than ``CHECK_S``), checked."""
        return self.check() if self.counter and not self.checked else []
