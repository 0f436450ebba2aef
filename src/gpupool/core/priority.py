"""The default priority classes. Preemptibility is a separate attribute with a per-class default."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    value: int
    preemptible: bool
    min_runtime_s: float = 0.0
    """Running time before a workload of this class may be preempted or reclaimed."""


PRODUCTION = PriorityClass("production", 125, preemptible=False)
TRAINING = PriorityClass("training", 100, preemptible=True, min_runtime_s=600.0)
INTERACTIVE = PriorityClass("interactive", 75, preemptible=True, min_runtime_s=60.0)
BATCH = PriorityClass("batch", 25, preemptible=True)

DEFAULT_CLASSES: tuple[PriorityClass, ...] = (PRODUCTION, TRAINING, INTERACTIVE, BATCH)


def class_named(name: str, classes: tuple[PriorityClass, ...] = DEFAULT_CLASSES) -> PriorityClass:
    for c in classes:
        if c.name == name:
            return c
    known = ", ".join(c.name for c in classes)
    raise KeyError(f"unknown priority class {name!r}; known classes: {known}")
