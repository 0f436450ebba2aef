"""A vectorised view of every node's free capacity, so a placement scan looks only at nodes that fit.

The working state marks a node dirty whenever its occupancy changes; the index refreshes dirty rows before
answering. Each node also gets a signature: nodes with equal signatures are indistinguishable to any
policy that scores by node state alone, so such a policy needs to score only one node per signature. In a
pool that does not share devices across projects a share also depends on who holds the node's other shares
(`DeviceState.admits`); `groups` adds that, relative to the project placing.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from gpupool.core.model import MILLI, Request
from gpupool.core.state import ANY_PROJECT, NO_SHARER, SEVERAL, NodeState

IntArray = npt.NDArray[np.int64]


class NodeIndex:
    def __init__(self, nodes: list[NodeState], dirty: set[int], signatures: dict[tuple[object, ...], int]) -> None:
        n = len(nodes)
        self.nodes = nodes
        self.whole_now = np.zeros(n, np.int64)
        self.whole_later = np.zeros(n, np.int64)
        self.share_now = np.zeros(n, np.int64)
        self.share_later = np.zeros(n, np.int64)
        self.cpu_now = np.zeros(n, np.int64)
        self.cpu_later = np.zeros(n, np.int64)
        self.mem_now = np.zeros(n, np.int64)
        self.mem_later = np.zeros(n, np.int64)
        self.signature = np.zeros(n, np.int64)
        self.sole_now = np.full(n, NO_SHARER, np.int64)
        self.sole_later = np.full(n, NO_SHARER, np.int64)
        """`NodeState.sole`, for placements now and pipelined ones; NO_SHARER where devices are shared freely."""
        self.exclusive = any(node.exclusive for node in nodes)
        self.schedulable = np.array([node.schedulable for node in nodes], dtype=bool)
        self._signatures = signatures
        self.dirty = dirty
        """Shared with the working state, which adds a node's index whenever the node changes."""
        self.dirty.update(range(n))

    def _refresh(self) -> None:
        for i in self.dirty:
            node = self.nodes[i]
            whole_now, whole_later, share_now, share_later = node.summary()
            self.whole_now[i], self.whole_later[i] = whole_now, whole_later
            self.share_now[i], self.share_later[i] = share_now, share_later
            self.cpu_later[i] = node.cpu - node.used_cpu
            self.cpu_now[i] = node.cpu - node.used_cpu - node.rel_cpu
            self.mem_later[i] = node.memory - node.used_memory
            self.mem_now[i] = node.memory - node.used_memory - node.rel_memory
            key = (
                node.pool,
                node.cpu,
                node.memory,
                node.used_cpu,
                node.used_memory,
                node.rel_cpu,
                node.rel_memory,
                tuple(
                    (d.index, d.model, d.memory, d.used, d.used_mem, d.whole, d.rel, d.rel_mem, d.rel_whole)
                    for d in node.devices
                ),
            )
            if node.exclusive:
                self.sole_now[i], self.sole_later[i] = node.sole(False), node.sole(True)
            sig = self._signatures.setdefault(key, len(self._signatures))
            self.signature[i] = sig
            node.signature = sig
        self.dirty.clear()

    def fitting(self, rows: IntArray, req: Request, pipelined: bool) -> IntArray:
        """The rows (node indices, ascending) whose free capacity could host one member of `req`."""
        if self.dirty:
            self._refresh()
        cpu = self.cpu_later if pipelined else self.cpu_now
        mem = self.mem_later if pipelined else self.mem_now
        mask = self.schedulable[rows] & (cpu[rows] >= req.cpu_milli) & (mem[rows] >= req.memory_mib)
        if req.gpus:
            mask &= (self.whole_later if pipelined else self.whole_now)[rows] >= req.gpus
        elif req.gpu_milli or req.gpu_memory_mib:
            need = min(req.gpu_milli, MILLI) or 1
            mask &= (self.share_later if pipelined else self.share_now)[rows] >= need
        return rows[mask]

    def groups(self, rows: IntArray, req: Request, project: int, pipelined: bool) -> IntArray:
        """Per row, a key equal for nodes that a policy scoring by node state alone scores alike for a member
        of `project`: the signature, and for a share where devices are not shared across projects, which of
        them admit it (`NodeState.admission`). That is all of them where no other project holds shares on
        the node; those free of shares where others do and the project does not (a function of the
        signature); it depends on each device where the project and others do, and such a node is a group
        of its own."""
        signature = self.signature[rows]
        if not self.exclusive or project == ANY_PROJECT or not (req.gpu_milli or req.gpu_memory_mib):
            return signature
        sole = (self.sole_later if pipelined else self.sole_now)[rows]
        admits = np.where((sole == NO_SHARER) | (sole == project), 0, 1)
        for k in np.flatnonzero(sole == SEVERAL).tolist():
            if self.nodes[rows[k]].holds(project, pipelined):
                admits[k] = 2 + rows[k]
        return signature * (len(self.nodes) + 2) + admits

    def distinct(self, rows: IntArray, keys: IntArray) -> IntArray:
        """The first (lowest) row of each key (`groups`) among `rows`, in ascending order."""
        _, first = np.unique(keys, return_index=True)
        return np.sort(rows[first])
