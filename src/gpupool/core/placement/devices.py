"""Predicates: which devices of a node can take one member's request."""

from __future__ import annotations

from collections.abc import Iterable

from gpupool.core.model import MILLI, DeviceShare, Request
from gpupool.core.state import DeviceState, NodeState


def allowed(d: DeviceState, models: frozenset[str]) -> bool:
    return not models or d.model in models


def free_whole_devices(node: NodeState, pipelined: bool, models: frozenset[str]) -> list[DeviceState]:
    return [d for d in node.devices if d.whole_free(pipelined) and allowed(d, models)]


def share_candidates(
    node: NodeState, req: Request, pipelined: bool, models: frozenset[str], project: int
) -> Iterable[tuple[DeviceState, int, int]]:
    """Devices that can take a fractional or memory request of `project`, with the (milli, MiB) it would take
    of each: room, and no other project's shares where the pool does not share devices across projects."""
    for d in node.devices:
        if not allowed(d, models):
            continue
        milli, mem = req.share_on(d.memory)
        if milli <= MILLI and d.fits_share(milli, mem, pipelined) and d.admits(project, pipelined):
            yield d, milli, mem


def whole_shares(devices: list[DeviceState]) -> tuple[DeviceShare, ...]:
    return tuple(DeviceShare(d.index, MILLI, d.memory) for d in devices)


def could_ever_fit(node: NodeState, req: Request, models: frozenset[str]) -> bool:
    """Whether an empty copy of this node could host the request (used to tell 'full' from 'never')."""
    if req.cpu_milli > node.cpu or req.memory_mib > node.memory:
        return False
    devices = [d for d in node.devices if allowed(d, models)]
    if req.gpus:
        return len(devices) >= req.gpus
    if req.gpu_milli:
        return bool(devices)
    if req.gpu_memory_mib:
        return any(d.memory >= req.gpu_memory_mib for d in devices)
    return True
