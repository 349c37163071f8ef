"""CPU package and DRAM energy from Intel RAPL counters in the Linux powercap sysfs tree.

Each zone (``/sys/class/powercap/intel-rapl:0`` = package 0, ``intel-rapl:0:1`` = its
DRAM, ...) has a micro-joule counter ``energy_uj`` that wraps at ``max_energy_range_uj``
(about 262 kJ: under an hour at 100 W). The counter is therefore read periodically and
the differences summed, undoing each wrap; a zone whose files cannot be read is recorded
as unavailable with the reason, and no energy is ever estimated from TDP.
"""
from __future__ import annotations

from pathlib import Path

DEFAULT_ROOT = Path("/sys/class/powercap")


class RaplZone:
    """One readable zone: its sysfs folder, its name ("package-0", "dram") and wrap limit."""

    def __init__(self, path: Path):
        self.path = path
        self.source = f"rapl:{path.name}"  # "rapl:intel-rapl:0:1": sub-zones keep their parent's prefix
        name_file = path / "name"
        self.name = name_file.read_text().strip() if name_file.exists() else path.name
        self.top = int((path / "max_energy_range_uj").read_text().strip())  # raises when unreadable
        if self.top <= 0:
            raise ValueError(f"max_energy_range_uj = {self.top}")
        self.last = self.read_raw()
        self.joules = 0.0  # accumulated since the first read

    def read_raw(self) -> int:
        return int((self.path / "energy_uj").read_text().strip())

    def update(self) -> float:
        """Read the counter, add the difference since the last read (one wrap undone); J since start."""
        raw = self.read_raw()
        delta = raw - self.last if raw >= self.last else raw + self.top - self.last
        self.last = raw
        self.joules += delta / 1e6
        return self.joules


class RaplCounters:
    """Every readable RAPL zone under ``root``; ``unavailable`` says why the others are not."""

    def __init__(self, root: Path = DEFAULT_ROOT):
        self.root = Path(root)
        self.zones: list[RaplZone] = []
        self.unavailable: dict[str, str] = {}
        paths = sorted(p for p in self.root.glob("intel-rapl:*") if (p / "energy_uj").exists())
        if not paths:
            self.unavailable["rapl"] = f"no RAPL zones under {self.root}"
        for path in paths:
            try:
                self.zones.append(RaplZone(path))
            except (OSError, ValueError) as e:  # PermissionError: energy_uj is root-only on recent kernels
                self.unavailable[f"rapl:{path.name}"] = f"{path} not readable ({type(e).__name__}: {e})"

    def reset(self) -> None:
        """Start counting from zero now."""
        for zone in self.zones:
            zone.last, zone.joules = zone.read_raw(), 0.0

    def read(self) -> dict[str, float]:
        """Joules since construction per zone source; a zone that stops being readable is dropped."""
        out = {}
        for zone in list(self.zones):
            try:
                out[zone.source] = zone.update()
            except (OSError, ValueError) as e:
                self.unavailable[zone.source] = f"stopped being readable ({type(e).__name__}: {e})"
                self.zones.remove(zone)
        return out

    def names(self) -> dict[str, str]:
        """Source -> the zone's own name, e.g. {"rapl:intel-rapl:0": "package-0"}."""
        return {z.source: z.name for z in self.zones}
