"""How much of each GPU model the work that accepts only some models will need.

Work pinned to a model (a "T4 only" inference service, an "A100 or H100" training job) can run nowhere
else, while unpinned work can run anywhere. An unpinned share that lands on a model whose capacity pinned
work would fill takes a place that pinned work will need, and the pinned work that comes later waits while
other models' GPUs stay idle. The pressure says, per model, how much of its capacity the pinned work would
take if the cluster's work came in the proportions of the demand, so the placement policy can keep unpinned
work off the models that pinned work needs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from gpupool.core.model import MILLI

ModelDemand = tuple[tuple[tuple[str, ...], int], ...]
"""GPU work by the models it accepts: (accepted models, sorted; empty for any model, milli-GPU)."""


def model_demand(work: Iterable[tuple[Iterable[str], int]]) -> ModelDemand:
    """(accepted models, milli-GPU) of each piece of work, summed by the set of models it accepts."""
    raw: dict[tuple[str, ...], int] = defaultdict(int)
    for models, milli in work:
        if milli > 0:
            raw[tuple(models)] += milli
    totals: dict[tuple[str, ...], int] = defaultdict(int)
    for models, milli in raw.items():  # a control plane's workloads name few sets, each in few spellings
        totals[tuple(sorted(set(models)))] += milli
    return tuple(sorted(totals.items()))


def model_pressure(capacity: Mapping[str, int], demand: ModelDemand) -> dict[str, int]:
    """Per mille of each model's capacity that pinned work would take: work that accepts several models is
    spread over those the cluster has, by their capacity. 1000 or more: pinned work alone fills the model.
    Models no pinned work asks for are left out (their pressure is 0)."""
    total_demand = sum(milli for models, milli in demand if _present(models, capacity))
    total_capacity = sum(capacity.values())
    if not total_demand or not total_capacity:
        return {}
    need: dict[str, int] = defaultdict(int)
    for models, milli in demand:
        accepted = [m for m in models if capacity.get(m)]
        spread = sum(capacity[m] for m in accepted)
        for m in accepted:
            need[m] += milli * capacity[m] // spread
    return {m: n * total_capacity * MILLI // (total_demand * capacity[m]) for m, n in sorted(need.items())}


def _present(models: tuple[str, ...], capacity: Mapping[str, int]) -> bool:
    """Whether work accepting `models` could run here at all (work for absent models never competes)."""
    return not models or any(capacity.get(m) for m in models)
