"""gpupool's scheduling core: a snapshot in, a decision out. Pure, deterministic, no I/O, no clock."""

from gpupool.core.config import SchedulerConfig
from gpupool.core.cycle import schedule
from gpupool.core.decision import Bind, Decision, Eviction, EvictReason, Pending, PendingCode, QueueShare
from gpupool.core.model import (
    MILLI,
    Device,
    DeviceShare,
    Node,
    Placement,
    PoolSettings,
    Queue,
    Quota,
    Request,
    Snapshot,
    State,
    Workload,
)
from gpupool.core.placement.policies import policy_names

__all__ = [
    "MILLI",
    "Bind",
    "Decision",
    "Device",
    "DeviceShare",
    "EvictReason",
    "Eviction",
    "Node",
    "Pending",
    "PendingCode",
    "Placement",
    "PoolSettings",
    "Queue",
    "QueueShare",
    "Quota",
    "Request",
    "SchedulerConfig",
    "Snapshot",
    "State",
    "Workload",
    "policy_names",
    "schedule",
]
