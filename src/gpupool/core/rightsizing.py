"""The right-sizing rule: from what a workload holds and what its telemetry saw, a smaller request or none.

Pure, so the control plane (gpupool.services.rightsizing, which says why the thresholds are what they are) and
the organisation simulation (gpupool.sim.org_util) apply the same rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from gpupool.core.model import MILLI

MIN_MINUTES = 30
"""Minutes with samples before any advice."""
MEMORY_UNDER = 0.5
"""Peak memory under this share of the grant (rule share)."""
BUSY_UNDER = 0.30
"""Busy share under this (rule share)."""
MEMORY_HEADROOM = 1.25
BUSY_HEADROOM = 2
GIB = 1024
FRACTION_STEP = 100
"""Milli-GPU: fractions are advised in tenths."""


@dataclass(frozen=True, slots=True)
class Grant:
    """What one worker holds (its largest member of its latest attempt)."""

    gpus: int
    """Whole GPUs (0: a share of one)."""
    milli: int
    memory_mib: int
    device_memory_mib: int
    """The memory of one of its devices."""


@dataclass(frozen=True, slots=True)
class Advice:
    rule: Literal["share", "gpus"]
    gpus: int | None = None
    gpu: float | None = None
    gpu_memory_mib: int | None = None
    advised_milli: int = 0
    granted_milli: int = 0
    message: str = ""


@dataclass(frozen=True, slots=True)
class Observed:
    """Its telemetry: peaks from the workload row, sums from its usage rows."""

    minutes: int
    milli_seconds: float
    busy_milli_seconds: float
    peak_memory_mib: int
    peak_util_pct: int

    @property
    def busy_share(self) -> float:
        return self.busy_milli_seconds / self.milli_seconds if self.milli_seconds > 0 else 0.0


def _gib(mib: float) -> str:
    return f"{round(mib / GIB, 1):g}"


def _at_most_gib(mib: int) -> str:
    """Rounded up to a tenth, so that "at most" stays true."""
    return f"{math.ceil(mib * 10 / GIB) / 10:g}"


def memory_ask(peak_mib: int) -> int:
    """The peak with headroom, in whole GiB (at least 1), in MiB."""
    return max(GIB, math.ceil(peak_mib * MEMORY_HEADROOM / GIB) * GIB)


def advise(grant: Grant, workers: int, seen: Observed) -> Advice | None:
    """The advice the rule gives (see the module's docstring), or None."""
    if seen.minutes < MIN_MINUTES or grant.milli <= 0 or grant.device_memory_mib <= 0:
        return None
    ask_mib = memory_ask(seen.peak_memory_mib)
    per_worker = " per worker" if workers > 1 else ""
    if grant.gpus >= 2:
        busy_gpus = math.ceil(seen.peak_util_pct * grant.gpus / 100)
        k = max(1, busy_gpus, -(-ask_mib // grant.device_memory_mib))
        if k >= grant.gpus:
            return None
        message = (
            f"busy at most {seen.peak_util_pct}% of {grant.gpus} GPUs and used at most "
            f"{_at_most_gib(seen.peak_memory_mib)} GiB of {_gib(grant.memory_mib)}: ask `--gpus {k}`{per_worker}"
        )
        return Advice("gpus", gpus=k, advised_milli=k * MILLI, granted_milli=grant.milli, message=message)
    if seen.peak_memory_mib >= grant.memory_mib * MEMORY_UNDER or seen.busy_share >= BUSY_UNDER:
        return None
    for_memory = -(-ask_mib * MILLI // grant.device_memory_mib)
    # Rounded first: a share of 0.1 summed from floats must not ask for 201 milli.
    for_busy = math.ceil(round(seen.busy_share * grant.milli * BUSY_HEADROOM, 6))
    milli = max(FRACTION_STEP, -(-max(for_memory, for_busy) // FRACTION_STEP) * FRACTION_STEP)
    if milli >= min(grant.milli, MILLI) or ask_mib >= grant.memory_mib:
        return None
    message = (
        f"used at most {_at_most_gib(seen.peak_memory_mib)} GiB of {_gib(grant.memory_mib)}, busy "
        f"{round(seen.busy_share * 100)}% of the time: ask `--gpu-memory {ask_mib // GIB}GiB` or "
        f"`--gpu {milli / MILLI:g}`{per_worker}"
    )
    return Advice(
        "share", gpu=milli / MILLI, gpu_memory_mib=ask_mib, advised_milli=milli, granted_milli=grant.milli,
        message=message,
    )  # fmt: skip
