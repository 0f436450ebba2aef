"""Find where every member of a workload goes: all members or none, a gang in one pool on the fewest nodes."""

from __future__ import annotations

from collections.abc import Callable

from gpupool.core.model import Placement, Request
from gpupool.core.placement.devices import could_ever_fit
from gpupool.core.placement.policies import Policy
from gpupool.core.state import NodeState, WorkingState, WorkloadState


class Placer:
    def __init__(self, state: WorkingState, policy: Policy) -> None:
        self.state = state
        self.policy = policy
        self._groups: dict[tuple[tuple[str, ...], tuple[str, ...], bool], list[list[NodeState]]] = {}
        self._ever: dict[tuple[object, ...], bool] = {}

    def groups(self, ws: WorkloadState) -> list[list[NodeState]]:
        """Candidate node groups in order of preference; a gang never spans two pools."""
        w = ws.w
        key = (w.pools, w.gpu_models, w.gang_size > 1)
        found = self._groups.get(key)
        if found is None:
            models = frozenset(w.gpu_models)
            usable = [n for n in self.state.nodes if not models or n.models & models]
            if w.pools:
                found = [[n for n in usable if n.pool == p] for p in w.pools]
            elif w.gang_size > 1:
                found = [[n for n in usable if n.pool == p] for p in self.state.pools]
            else:
                found = [usable]
            found = [g for g in found if g]
            self._groups[key] = found
        return found

    def ever_fits(self, ws: WorkloadState) -> bool:
        """Whether an empty cluster could host the whole workload (else it is pending for good)."""
        w = ws.w
        key = (w.pools, w.gpu_models, w.gang_size, w.request)
        found = self._ever.get(key)
        if found is None:
            models = frozenset(w.gpu_models)
            found = False
            for group in self.groups(ws):
                room = 0
                for n in group:
                    if could_ever_fit(n, w.request, models):
                        room += _members_on_empty(n, w.request, models)
                        if room >= w.gang_size:
                            found = True
                            break
                if found:
                    break
            self._ever[key] = found
        return found

    def place(
        self, ws: WorkloadState, pipelined: bool, pool_ok: Callable[[int], bool]
    ) -> tuple[Placement, ...] | None:
        for group in self.groups(ws):
            nodes = [n for n in group if pool_ok(n.pool_idx)] if len(self.state.pools) > 1 else group
            if not nodes:
                continue
            placements = self.place_in(ws, nodes, pipelined)
            if placements is not None:
                return placements
        return None

    def place_in(self, ws: WorkloadState, nodes: list[NodeState], pipelined: bool) -> tuple[Placement, ...] | None:
        w = ws.w
        req = w.request
        models = frozenset(w.gpu_models)
        evaluate = self.policy.evaluate
        if w.gang_size == 1:
            best_key: tuple[float, int] | None = None
            best: tuple[NodeState, tuple] | None = None  # type: ignore[type-arg]
            for node in nodes:
                if not node.schedulable or not node.fits_host(req, pipelined):
                    continue
                found = evaluate(node, req, pipelined, models)
                if found is None:
                    continue
                key = (found[1], -node.idx)
                if best_key is None or key > best_key:
                    best_key, best = key, (node, found[0])
            if best is None:
                return None
            return (Placement(0, best[0].name, best[1]),)
        return self._place_gang(ws, nodes, pipelined, models)

    def _place_gang(
        self, ws: WorkloadState, nodes: list[NodeState], pipelined: bool, models: frozenset[str]
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
                for node in nodes:
                    if not node.schedulable or not node.fits_host(req, pipelined):
                        continue
                    found = self.policy.evaluate(node, req, pipelined, models)
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


def _members_on_empty(node: NodeState, req: Request, models: frozenset[str]) -> int:
    by_host = min(
        node.cpu // req.cpu_milli if req.cpu_milli else 1 << 30,
        node.memory // req.memory_mib if req.memory_mib else 1 << 30,
    )
    if req.gpus:
        devices = sum(1 for d in node.devices if not models or d.model in models)
        return min(by_host, devices // req.gpus)
    return min(by_host, 1 << 30)
