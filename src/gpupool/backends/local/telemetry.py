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
class GroupUse:
    cpu_s: float
    rss_mib: int
    pids: tuple[int, ...]


def process_groups() -> dict[int, GroupUse]:
    """CPU seconds (including reaped children) and resident memory of every process group on the host."""
    cpu: dict[int, float] = {}
    rss: dict[int, int] = {}
    pids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
            pgrp = int(fields[2])
            ticks = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
            cpu[pgrp] = cpu.get(pgrp, 0.0) + ticks / _TICK
            rss[pgrp] = rss.get(pgrp, 0) + int(int(fields[21]) * _PAGE_MIB)
            pids.setdefault(pgrp, []).append(int(entry.name))
    return {g: GroupUse(cpu[g], rss[g], tuple(pids[g])) for g in cpu}


class CpuActivity:
    """Utilisation per process group between successive calls, as a share of one CPU core (0-100)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: dict[int, tuple[float, float]] = {}

    def measure(self, groups: Iterable[int], use: dict[int, GroupUse]) -> dict[int, int]:
        now = self._clock()
        out: dict[int, int] = {}
        seen = set()
        for g in groups:
            seen.add(g)
            cpu = use[g].cpu_s if g in use else 0.0
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
