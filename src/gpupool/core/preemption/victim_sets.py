"""Which victims on one node make room for a member, and how victim sets compare (on a node, across nodes).

The rule: a set of lower priority wins (the highest priority it evicts is lowest); then the fewest workloads;
then the least work lost; then the set of the most recently started (its oldest victim started last). Ties
keep the order used before the rule: on a node the greedy set below (then the lowest ids), across nodes
the first node. Work lost is a victim's GPU times the time since it started or last checkpointed, so a victim that
just saved a checkpoint costs little; a gang counts once, with all its members' GPUs, wherever they run.

On a node, the greedy pass (lowest priority, newest first, until the member fits, then any victim it does
not need put back) gives the lowest priority any set can have and a first answer. A search over the
candidates of at most that priority then looks for fewer victims, and at that count for less work lost.
For a member asking for GPUs it looks first at the sets its devices call for: the holders of each choice of
whole devices to free, or subsets of the holders of one device to share. Only when none of those fits (the
node is short of CPU or memory as well) does it look at every set of candidates, a size at a time. It is
bounded: at most `SEARCH_STEPS` sets or branches per node, the candidate sets cut short by a size too small
to free what the member needs (GPU, CPU, memory) and by the work lost of the best set so far. When the steps
run out it keeps the best set found, which is the greedy one if nothing cheaper turned up.
"""

from __future__ import annotations

from itertools import accumulate, combinations

from gpupool.core.model import MILLI, Request
from gpupool.core.state import NodeState, WorkloadState

SEARCH_STEPS = 512
"""Most candidate sets looked at per node beyond the greedy one: crowded nodes of small work stay cheap."""

SetKey = tuple[int, int, int, tuple[float, ...]]


def work_lost(v: WorkloadState, now: float) -> int:
    """GPU milli-seconds an eviction throws away: all its GPU (every member) since it started or last
    checkpointed."""
    w = v.w
    since = now if w.start_time is None else w.start_time
    if w.checkpoint_time is not None:
        since = max(since, w.checkpoint_time)
    return int(v.milli * max(0.0, now - since))


def started(v: WorkloadState, now: float) -> float:
    return now if v.w.start_time is None else v.w.start_time


def set_key(victims: list[WorkloadState], now: float) -> SetKey:
    """How a victim set compares: lower is cheaper (see the module's rule)."""
    return (
        max((v.w.priority for v in victims), default=-(1 << 30)),
        len(victims),
        sum(work_lost(v, now) for v in victims),
        tuple(-s for s in sorted(started(v, now) for v in victims)),
    )


class NodeModel:
    """Just enough of a node to ask 'does the member fit if these workloads leave?' without the journal."""

    __slots__ = ("cpu", "devices", "holders", "memory", "node", "project", "req")

    def __init__(self, node: NodeState, req: Request, models: frozenset[str], project: int) -> None:
        self.node, self.req, self.project = node, req, project
        self.cpu, self.memory = node.used_cpu, node.used_memory
        self.devices = {
            d.index: [d.used, d.used_mem, d.whole, d.memory] for d in node.devices if not models or d.model in models
        }
        self.holders: dict[int, dict[int, int]] = {}
        """Where the pool does not share devices across projects: device -> project -> shares it holds."""
        if node.exclusive and (req.gpu_milli or req.gpu_memory_mib):
            self.holders = {d.index: dict(d.holders) for d in node.devices if d.index in self.devices}

    def remove(self, v: WorkloadState, sign: int = 1) -> None:
        for p in v.placements:
            if p.node != self.node.name:
                continue
            self.cpu -= sign * v.w.request.cpu_milli
            self.memory -= sign * v.w.request.memory_mib
            for s in p.devices:
                d = self.devices.get(s.index)
                if d is not None:
                    d[0] -= sign * s.milli
                    d[1] -= sign * s.memory_mib
                    if v.w.request.gpus:
                        d[2] = sign < 0
                    elif s.index in self.holders:
                        held = self.holders[s.index]
                        held[v.queue] = held.get(v.queue, 0) - sign

    def admits(self, index: int) -> bool:
        """Whether the device's remaining shares are all of the member's project (where that matters)."""
        held = self.holders.get(index)
        return held is None or all(q == self.project or not n for q, n in held.items())

    def fits(self) -> bool:
        req, node = self.req, self.node
        if self.cpu + req.cpu_milli > node.cpu or self.memory + req.memory_mib > node.memory:
            return False
        if req.gpus:
            return sum(1 for d in self.devices.values() if d[0] == 0) >= req.gpus
        if req.gpu_milli or req.gpu_memory_mib:
            for index, (used, used_mem, whole, memory) in self.devices.items():
                milli, mem = req.share_on(memory)
                if not whole and used + milli <= MILLI and used_mem + mem <= memory and self.admits(index):
                    return True
            return False
        return True

    def needs(self) -> tuple[int, int, int]:
        """What any victim set must free for the member to fit: GPU milli (on devices it may use), CPU and
        memory. A lower bound, to cut the search short."""
        req, node = self.req, self.node
        gpu = 0
        if req.gpus:
            taken = sorted(d[0] for d in self.devices.values() if d[0])
            short = req.gpus - (len(self.devices) - len(taken))
            gpu = sum(taken[:short]) if short > 0 else 0
        elif req.gpu_milli or req.gpu_memory_mib:
            over = [used + req.share_on(memory)[0] - MILLI for used, _, _, memory in self.devices.values()]
            gpu = max(0, min(over, default=0))
        cpu = self.cpu + req.cpu_milli - node.cpu
        memory = self.memory + req.memory_mib - node.memory
        return gpu, max(0, cpu), max(0, memory)

    def frees(self, v: WorkloadState) -> tuple[int, int, int]:
        """GPU milli (on devices the member may use), CPU and memory that `v` leaving frees here."""
        gpu = cpu = memory = 0
        for p in v.placements:
            if p.node == self.node.name:
                cpu += v.w.request.cpu_milli
                memory += v.w.request.memory_mib
                gpu += sum(s.milli for s in p.devices if s.index in self.devices)
        return gpu, cpu, memory


def greedy_set(model: NodeModel, candidates: list[WorkloadState]) -> list[WorkloadState] | None:
    """Candidates in order until the member fits, then any it does not need put back (last taken first);
    None if even all do not do. Leaves the model with the set it returns (or every candidate) removed."""
    chosen: list[WorkloadState] = []
    for v in candidates:
        model.remove(v)
        chosen.append(v)
        if model.fits():
            break
    else:
        return None
    for v in list(reversed(chosen)):
        model.remove(v, sign=-1)  # put it back: keep it only if the member still fits
        if model.fits():
            chosen.remove(v)
        else:
            model.remove(v)
    return chosen


def victims_on(
    node: NodeState, candidates: list[WorkloadState], req: Request, models: frozenset[str], project: int, now: float
) -> list[WorkloadState] | None:
    """The cheapest victim set on `node` that lets a member of `project` start; None if even all candidates
    do not do. `candidates` come lowest priority first."""
    model = NodeModel(node, req, models, project)
    greedy = greedy_set(model, candidates)
    if not greedy:
        return greedy
    top = max(v.w.priority for v in greedy)
    # No set of lower priority fits: the greedy pass took all of them before one of `top`.
    pool = [v for v in candidates if v.w.priority <= top]
    if len(pool) == len(greedy):
        return greedy
    for v in greedy:
        model.remove(v, sign=-1)
    return _Search(model, pool, greedy, now).run()


class _Search:
    """Fewest victims, then least work lost, starting from the greedy set. Where the member asks for GPUs,
    the sets looked at first are those a device needs: the holders of whole devices to free (every choice
    of devices), or some holders of one device to share; only if none of those fits (the node is short of
    CPU or memory too) is every set of candidates looked at, a size at a time, smallest first."""

    def __init__(self, model: NodeModel, pool: list[WorkloadState], greedy: list[WorkloadState], now: float) -> None:
        self.model, self.now = model, now
        self.pool = pool
        self.position = {v.idx: i for i, v in enumerate(pool)}
        """Where each stands among the candidates: a chosen set keeps their order."""
        self.lost = {v.idx: work_lost(v, now) for v in pool}
        self.need = model.needs()
        self.steps = SEARCH_STEPS
        self.best: tuple[tuple[SetKey, bool, tuple[str, ...]], list[WorkloadState]] = (
            (set_key(greedy, now), False, ()),
            greedy,
        )
        """The cheapest set so far, by the rule, then not the greedy set, then its ids."""
        self.found = False
        """Whether a set looked at so far fits."""
        self.chosen: list[WorkloadState] = []

    def run(self) -> list[WorkloadState]:
        req = self.model.req
        if req.gpus:
            self._whole_devices(req.gpus)
        elif req.gpu_milli or req.gpu_memory_mib:
            for holders in self._holders()[0].values():
                self._within(holders)
        if not self.found:
            self._within(self.pool)
        return self.best[1]

    def _holders(self) -> tuple[dict[int, list[WorkloadState]], list[int]]:
        """Device -> the pool's workloads holding it (devices the member may use); and the devices held by
        nothing else, in order."""
        node, devices = self.model.node.name, self.model.devices
        holders: dict[int, list[WorkloadState]] = {}
        held: dict[int, int] = {}
        for v in self.pool:
            for p in v.placements:
                if p.node != node:
                    continue
                for share in p.devices:
                    if share.index in devices:
                        holders.setdefault(share.index, []).append(v)
                        held[share.index] = held.get(share.index, 0) + share.milli
        return holders, [i for i in sorted(holders) if held[i] == devices[i][0]]

    def _whole_devices(self, gpus: int) -> None:
        """Each choice of devices to free, taking all their holders."""
        holders, freeable = self._holders()
        short = gpus - sum(1 for d in self.model.devices.values() if d[0] == 0)
        if short <= 0:
            return  # its GPUs are free: what it lacks is CPU or memory
        for chosen in combinations(freeable, short):
            if self.steps <= 0:
                return
            self.steps -= 1
            victims = list({v.idx: v for i in chosen for v in holders[i]}.values())
            self._consider(victims, check=True)

    def _consider(self, victims: list[WorkloadState], check: bool) -> None:
        best = self.best[0][0]
        if len(victims) > best[1] or (len(victims) == best[1] and sum(self.lost[v.idx] for v in victims) > best[2]):
            return
        if check:
            for v in victims:
                self.model.remove(v)
            fits = self.model.fits()
            for v in victims:
                self.model.remove(v, sign=-1)
            if not fits:
                return
        self.found = True
        key = (set_key(victims, self.now), True, tuple(sorted(v.w.id for v in victims)))
        if key < self.best[0]:
            self.best = (key, sorted(victims, key=lambda v: self.position[v.idx]))

    def _within(self, pool: list[WorkloadState]) -> None:
        """Every set of `pool` up to the size of the best set so far (within the steps left)."""
        order = sorted(pool, key=lambda v: (self.lost[v.idx], -started(v, self.now), v.w.id))
        frees = [self.model.frees(v) for v in order]
        # The most any r of them could free, per resource: rules out sets too small to make room.
        most = [[0, *accumulate(sorted((f[r] for f in frees), reverse=True))] for r in range(len(self.need))]
        cheapest = [0, *accumulate(self.lost[v.idx] for v in order)]
        size = 1
        while size <= min(self.best[0][0][1], len(order)) and self.steps > 0:
            self._extend(order, frees, most, cheapest, 0, size, 0, (0, 0, 0))
            size += 1

    def _extend(
        self,
        order: list[WorkloadState],
        frees: list[tuple[int, int, int]],
        most: list[list[int]],
        cheapest: list[int],
        start: int,
        size: int,
        lost: int,
        freed: tuple[int, int, int],
    ) -> None:
        left = size - len(self.chosen)
        if left == 0:
            if self.model.fits():
                self._consider(self.chosen, check=False)
            return
        for i in range(start, len(order) - left + 1):
            if self.steps <= 0:
                return
            self.steps -= 1
            best = self.best[0][0]
            # Too many, or the cheapest completion from here costs more than the best set: so does every later one.
            if size > best[1] or (size == best[1] and lost + cheapest[i + left] - cheapest[i] > best[2]):
                return
            f = frees[i]
            now_freed = (freed[0] + f[0], freed[1] + f[1], freed[2] + f[2])
            if any(now_freed[r] + most[r][left - 1] < self.need[r] for r in range(3)):
                continue
            v = order[i]
            self.model.remove(v)
            self.chosen.append(v)
            self._extend(order, frees, most, cheapest, i + 1, size, lost + self.lost[v.idx], now_freed)
            self.chosen.pop()
            self.model.remove(v, sign=-1)
