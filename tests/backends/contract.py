"""What every backend promises the control loop, written once and run against each backend."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gpupool.backends.base import Backend, LaunchSpec, Observed


@dataclass
class Harness:
    backend: Backend
    spec: Callable[[str, float, int], LaunchSpec]
    """(allocation id, seconds it runs, exit code) → a launch of a member that does just that."""


def _until(h: Harness, alloc: str, check: Callable[[Observed | None], bool], timeout: float = 60) -> Observed | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = h.backend.observe().get(alloc)
        if check(seen):
            return seen
        time.sleep(0.1)
    raise AssertionError(f"{alloc}: last seen {h.backend.observe().get(alloc)}")


def run_contract(h: Harness, prefix: str) -> None:
    nodes = h.backend.inventory()
    assert nodes and all(n.devices for n in nodes) and h.backend.capabilities().name

    ok, bad, stopped = f"{prefix}-0-0", f"{prefix}-1-0", f"{prefix}-2-0"
    h.backend.launch(h.spec(ok, 2, 0))
    h.backend.launch(h.spec(ok, 2, 0))  # a retry: still one member
    h.backend.launch(h.spec(bad, 1, 1))
    h.backend.launch(h.spec(stopped, 3600, 0))
    for alloc in (ok, bad, stopped):
        _until(h, alloc, lambda o: o is not None)
    assert len([a for a in h.backend.observe() if a.startswith(prefix)]) == 3  # the retry made no second member
    assert _until(h, ok, lambda o: o is not None and not o.alive).exit_code == 0  # type: ignore[union-attr]
    assert _until(h, bad, lambda o: o is not None and not o.alive).exit_code == 1  # type: ignore[union-attr]

    _until(h, stopped, lambda o: o is not None and o.alive)
    h.backend.stop(stopped, force=False)
    h.backend.stop(stopped, force=True)
    _until(h, stopped, lambda o: o is None or not o.alive)
    for alloc in (ok, bad, stopped):
        h.backend.forget(alloc)
    for alloc in (ok, bad, stopped):
        _until(h, alloc, lambda o: o is None)  # forgotten: the backend no longer reports it
