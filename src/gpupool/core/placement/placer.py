"""Find where every member of a workload goes: all members or none, a gang in one pool of one cluster on the fewest
nodes."""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable

import numpy as np

from gpupool.core.feasibility import ever_fits, node_groups
from gpupool.core.model import DeviceShare, Placement, Request
from gpupool.core.placement.index import IntArray, NodeIndex
from gpupool.core.placement.policies import Policy
from gpupool.core.state import ANY_PROJECT, NodeState, WorkingState, WorkloadState

GroupKey = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], bool]
"""What decides a workload's candidate node groups (`node_groups`): its pools, clusters, models, and being a gang."""


def group_key(ws: WorkloadState) -> GroupKey:
    w = ws.w
    return (w.pools, w.clusters, w.gpu_models, w.gang_size > 1)


class Placer:
    def __init__(self, state: WorkingState, policy: Policy) -> None:
        self.state = state
        self.policy = policy
        self._groups: dict[GroupKey, list[list[NodeState]]] = {}
        self._ever: dict[tuple[object, ...], bool] = {}
        self._split: dict[GroupKey, list[list[tuple[int, IntArray]]]] = {}
        self._all: dict[GroupKey, IntArray] = {}
        self._ranks: dict[int, int] = {}
        self.index = NodeIndex(state.nodes, state.dirty, policy.ctx.memo.signatures)

    def groups(self, ws: WorkloadState) -> list[list[NodeState]]:
        """Candidate node groups in order of preference; a gang never spans two pools nor two clusters."""
        w = ws.w
        key = group_key(ws)
        found = self._groups.get(key)
        if found is None:
            found = node_groups(self.state.nodes, w.pools, w.gang_size > 1, frozenset(w.gpu_models), w.clusters)
            self._groups[key] = found
        return found

    def ever_fits(self, ws: WorkloadState) -> bool:
        """Whether its candidate nodes, all empty, could host the whole workload (else it is pending for good)."""
        w = ws.w
        key = (w.pools, w.clusters, w.gpu_models, w.gang_size, w.request)
        found = self._ever.get(key)
        if found is None:
            found = ever_fits(self.groups(ws), w.request, w.gang_size, frozenset(w.gpu_models))
            self._ever[key] = found
        return found

    def pools_of(self, ws: WorkloadState) -> list[list[tuple[int, IntArray]]]:
        """The groups of `groups()`, each split by pool: (pool index, its node rows in ascending order)."""
        key = group_key(ws)
        found = self._split.get(key)
        if found is None:
            found = []
            for group in self.groups(ws):
                by_pool: dict[int, list[int]] = {}
                for n in group:
                    by_pool.setdefault(n.pool_idx, []).append(n.idx)
                found.append([(p, np.array(sorted(rows), dtype=np.int64)) for p, rows in sorted(by_pool.items())])
            self._split[key] = found
        return found

    def candidate_pools(self, ws: WorkloadState) -> list[int]:
        return sorted({p for group in self.pools_of(ws) for p, _ in group})

    def candidates(self, ws: WorkloadState) -> IntArray:
        """Every node of its groups, ascending."""
        key = group_key(ws)
        found = self._all.get(key)
        if found is None:
            found = self._all[key] = np.array(sorted({n.idx for g in self.groups(ws) for n in g}), dtype=np.int64)
        return found

    def rows(self, group: list[tuple[int, IntArray]], pool_ok: Callable[[int], bool]) -> IntArray | None:
        parts = [rows for p, rows in group if pool_ok(p)]
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else np.sort(np.concatenate(parts))

    def place(
        self,
        ws: WorkloadState,
        pipelined: bool,
        pool_ok: Callable[[int], bool],
        only: set[int] | None = None,
        share_rule: bool = True,
    ) -> tuple[Placement, ...] | None:
        """Place every member in the first group that takes them all; `only` restricts the nodes. Without
        `share_rule` it ignores whose shares a device holds, to tell whether that rule alone is in the way."""
        for group in self.pools_of(ws):
            rows = self.rows(group, pool_ok)
            if rows is not None and only is not None:
                rows = rows[np.isin(rows, sorted(only))]
            if rows is None or not len(rows):
                continue
            placements = self.place_in(ws, rows, pipelined, share_rule)
            if placements is not None:
                return placements
        return None

    def fitting(self, rows: IntArray, req: Request, pipelined: bool, distinct: bool, project: int) -> list[NodeState]:
        """Nodes among `rows` with room for one member of `project`; one per group (`NodeIndex.groups`) if
        `distinct` and the policy allows."""
        fit = self.index.fitting(rows, req, pipelined)
        if distinct and self.policy.state_only and len(fit) > 1:
            fit = self.index.distinct(fit, self.index.groups(fit, req, project, pipelined))
        nodes = self.state.nodes
        return [nodes[i] for i in fit.tolist()]

    def place_in(
        self, ws: WorkloadState, rows: IntArray, pipelined: bool, share_rule: bool = True
    ) -> tuple[Placement, ...] | None:
        w = ws.w
        models = frozenset(w.gpu_models)
        project = ws.queue if share_rule else ANY_PROJECT
        if w.gang_size > 1:
            return self._place_gang(ws, rows, pipelined, models, project)
        req = w.request
        fit = self.index.fitting(rows, req, pipelined)
        if not len(fit):
            return None
        policy = self.policy
        groups = self.index.groups(fit, req, project, pipelined) if policy.state_only and len(fit) > 1 else None
        reps = fit if groups is None else self.index.distinct(fit, groups)
        nodes = self.state.nodes
        best_score: float | None = None
        best: list[tuple[int, tuple[DeviceShare, ...]]] = []
        for i in reps.tolist():
            found = policy.evaluate(nodes[i], req, pipelined, models, project)
            if found is None:
                continue
            if best_score is None or found[1] > best_score:
                best_score, best = found[1], [(i, found[0])]
            elif found[1] == best_score:
                best.append((i, found[0]))
        if not best:
            return None
        if policy.ties == "lowest":
            i, shares = best[0]  # the lowest index among the best
            return (Placement(0, nodes[i].name, shares),)
        if groups is None:
            tied = [i for i, _ in best]
        else:  # every node in the same group as a best representative ties with it
            where = np.searchsorted(fit, [i for i, _ in best])
            tied = fit[np.isin(groups, groups[where])].tolist()
        rng = random.Random(f"{policy.ctx.seed}:{w.id}")
        if policy.ties == "random":
            node = nodes[tied[rng.randrange(len(tied))]]
        else:
            node = nodes[min(tied, key=self._tie_rank)]
        found = policy.evaluate(node, req, pipelined, models, project)
        assert found is not None
        return (Placement(0, node.name, policy.finalize(node, req, found[0], pipelined, models, project, rng)),)

    def _tie_rank(self, i: int) -> int:
        """A node's place in a fixed order drawn from the seed (the node order of the FGD simulator's run)."""
        rank = self._ranks.get(i)
        if rank is None:
            rank = self._ranks[i] = zlib.crc32(f"{self.policy.ctx.seed}:{self.state.nodes[i].name}".encode())
        return rank

    def _place_gang(
        self, ws: WorkloadState, rows: IntArray, pipelined: bool, models: frozenset[str], project: int
    ) -> tuple[Placement, ...] | None:
        req = ws.w.request
        state = self.state
        checkpoint = state.checkpoint()
        used: set[int] = set()
        placements: list[Placement] = []
        try:
            for member in range(ws.w.gang_size):
                remaining = ws.w.gang_size - member
                best_key: tuple[bool, int, float, int] | None = None
                best: Placement | None = None
                best_node: NodeState | None = None
                for node in self.fitting(rows, req, pipelined, False, project):
                    found = self.policy.evaluate(node, req, pipelined, models, project)
                    if found is None:
                        continue
                    room = min(remaining, _members_now(node, req, pipelined))
                    key = (node.idx in used, room, found[1], -node.idx)
                    if best_key is None or key > best_key:
                        best_key, best, best_node = key, Placement(member, node.name, found[0]), node
                if best is None or best_node is None:
                    return None
                placements.append(best)
                used.add(best_node.idx)
                state.hold(ws, best)
            return tuple(placements)
        finally:
            state.rollback(checkpoint)


def _members_now(node: NodeState, req: Request, pipelined: bool) -> int:
    if req.gpus:
        return node.free_whole(pipelined) // req.gpus
    return 1
