"""GPU activity of local members: from NVML on real GPUs; modelled from CPU activity on simulated ones.

The model: a member whose processes keep a CPU core busy keeps its GPU share busy; a sleeping notebook leaves it
idle. It is what lets idle detection and cost reports be exercised honestly without hardware.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE_MIB = os.sysconf("SC_PAGE_SIZE") / (1024 * 1024)


@dataclass(frozen=True, slots=True)
class Proc:
    pid: int
    ppid: int
    cpu_s: float
    """User and system time, including children it has reaped."""
    rss_mib: int


def processes() -> dict[int, Proc]:
    out: dict[int, Proc] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
            ticks = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
            pid = int(entry.name)
            out[pid] = Proc(pid, int(fields[1]), ticks / _TICK, int(int(fields[21]) * _PAGE_MIB))
    return out


def tree(procs: dict[int, Proc], root: int) -> list[Proc]:
    """A member's root process and all its descendants, wherever they moved (a Jupyter kernel starts a
    session of its own, so the process group alone would miss it)."""
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    out: list[Proc] = []
    stack = [root]
    while stack:
        pid = stack.pop()
        if pid in procs:
            out.append(procs[pid])
            stack.extend(children.get(pid, ()))
    return out


class CpuActivity:
    """Utilisation of each process tree between successive calls, as a share of one CPU core (0-100)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: dict[int, tuple[float, float]] = {}

    def measure(self, roots: Iterable[int], procs: dict[int, Proc]) -> dict[int, int]:
        now = self._clock()
        out: dict[int, int] = {}
        seen = set()
        for g in roots:
            seen.add(g)
            cpu = sum(p.cpu_s for p in tree(procs, g))
            prev = self._last.get(g)
            self._last[g] = (now, cpu)
            if prev is None or now <= prev[0]:
                out[g] = 0
                continue
            out[g] = max(0, min(100, round(100 * (cpu - prev[1]) / (now - prev[0]))))
        for g in list(self._last):
            if g not in seen:
                del self._last[g]
        return out


class NvmlReader:
    """Device utilisation and memory, and per-process memory, from the driver. Any NVML error gives None, and
    the caller falls back to the model for that sample."""

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()

    def read(self, count: int) -> tuple[dict[int, tuple[int, int]], dict[int, int]] | None:
        """({device: (util %, memory used MiB)}, {pid: GPU memory used MiB})."""
        nv = self._nvml
        try:
            devices: dict[int, tuple[int, int]] = {}
            per_pid: dict[int, int] = {}
            for i in range(count):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                util = nv.nvmlDeviceGetUtilizationRates(h).gpu
                used = nv.nvmlDeviceGetMemoryInfo(h).used // (1024 * 1024)
                devices[i] = (int(util), int(used))
                for proc in nv.nvmlDeviceGetComputeRunningProcesses(h):
                    mem = proc.usedGpuMemory or 0
                    per_pid[proc.pid] = per_pid.get(proc.pid, 0) + int(mem) // (1024 * 1024)
            return devices, per_pid
        except nv.NVMLError:
            return None
