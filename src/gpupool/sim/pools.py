"""The simulator's pools let fractions of different projects share a device.

The live default keeps a device's shares to one project (`PoolSettings`); the simulator's published packing
and fairness figures assume any workload may share a device with any other, so its pools say so explicitly.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpupool.core import Node, PoolSettings

SHARED = PoolSettings(share_across_projects=True)


def shared_pools(nodes: Iterable[Node]) -> dict[str, PoolSettings]:
    """Every pool of `nodes`, sharing devices across projects."""
    return {pool: SHARED for pool in sorted({n.pool for n in nodes})}
