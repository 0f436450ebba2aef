"""What every backend promises the control loop, written once and run against each backend, one test per promise
(capabilities, launch, observe, stop, logs, health, telemetry), so that a failure names the promise it broke.

A backend's test module subclasses `BackendContract` and gives it a `harness` fixture: the backend, started, and
how to turn a `Member` (what a test wants a member to do) into that backend's LaunchSpec."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import count

from gpupool.backends.base import Backend, LaunchSpec, Observed
from tests.e2e.conftest import free_port, wait_for

SYNC_S = 30.0
"""How long a started backend may take to answer observe() with a dict (it answers None until synced)."""
DEADLINE_S = 60.0
"""How long a member may take to be seen doing what it was asked to."""


@dataclass(frozen=True)
class Member:
    """What a test asks one member to do: run `seconds` and exit with `exit_code`, writing `says` (a line) to its
    output first; with a `port`, serve HTTP there instead."""

    alloc: str
    workload_id: int
    seconds: float = 3600
    exit_code: int = 0
    says: str | None = None
    port: int | None = None


@dataclass
class Harness:
    backend: Backend
    spec: Callable[[Member], LaunchSpec]
    output: bool = True
    """Whether a member's output reaches read_log (where kwok plays the kubelet, no container runs or writes)."""
    sampled: bool = True
    """Whether sample() reports running members (the kubernetes backend reports none yet)."""


_ids = count(1)


def member(
    prefix: str, seconds: float = 3600, exit_code: int = 0, says: str | None = None, port: int | None = None
) -> Member:
    """A member with an allocation id and a workload id no other member of this session has."""
    n = next(_ids)
    return Member(f"{prefix}-{n}-0", 1000 + n, seconds, exit_code, says, port)


def observed(backend: Backend) -> dict[str, Observed]:
    """What observe() answers once the backend is synced; it may answer None before that."""
    answers: list[dict[str, Observed] | None] = [None]

    def look() -> bool:
        answers[0] = backend.observe()
        return answers[0] is not None  # an empty dict is an answer too

    wait_for(look, SYNC_S, "observe() to answer a dict")
    return answers[0] or {}


def until(h: Harness, alloc: str, check: Callable[[Observed | None], bool], what: str) -> Observed | None:
    """Poll observe() until `check` holds for the allocation; fail naming `what` and what was last seen."""
    seen: list[Observed | None] = []

    def look() -> bool:
        answer = h.backend.observe()
        if answer is None:  # not synced: nothing can be concluded from an absence
            return False
        seen[:] = [answer.get(alloc)]
        return check(seen[0])

    wait_for(look, DEADLINE_S, f"{alloc} {what} (last seen: {seen})")
    return seen[0]


def alive(o: Observed | None) -> bool:
    return o is not None and o.alive


def ended(o: Observed | None) -> bool:
    return o is not None and not o.alive


def launch_running(h: Harness, m: Member) -> None:
    h.backend.launch(h.spec(m))
    until(h, m.alloc, alive, "to be running")


def end(h: Harness, *members: Member) -> None:
    """Stop and forget members, so a test leaves nothing running."""
    for m in members:
        h.backend.stop(m.alloc, force=True)
    for m in members:
        until(h, m.alloc, lambda o: o is None or not o.alive, "to end")
        h.backend.forget(m.alloc)


class BackendContract:
    """The promises. Subclasses provide the `harness` fixture."""

    def test_capabilities_say_what_it_is_and_what_it_has(self, harness: Harness) -> None:
        caps = harness.backend.capabilities()
        assert caps.name and isinstance(caps.name, str)
        assert caps == harness.backend.capabilities()  # asked again: the same answer
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in caps.isolation.items())
        nodes = harness.backend.inventory()
        assert nodes, "no node in the inventory"
        assert len({n.name for n in nodes}) == len(nodes)
        for n in nodes:
            indices = [d.index for d in n.devices]
            assert indices and len(set(indices)) == len(indices), n
            assert n.pool and all(d.memory_mib > 0 for d in n.devices), n

    def test_observe_answers_once_synced_and_reports_how_members_ended(self, harness: Harness) -> None:
        h = harness
        before = observed(h.backend)
        ok, bad = member("obs", seconds=1), member("obs", seconds=1, exit_code=1)
        assert ok.alloc not in before and bad.alloc not in before
        for m in (ok, bad):
            h.backend.launch(h.spec(m))
        assert until(h, ok.alloc, ended, "to end with 0") == Observed(ok.alloc, False, 0)
        assert until(h, bad.alloc, ended, "to end with 1") == Observed(bad.alloc, False, 1)
        for m in (ok, bad):
            h.backend.forget(m.alloc)
        for m in (ok, bad):
            until(h, m.alloc, lambda o: o is None, "to be forgotten")

    def test_launch_is_keyed_by_allocation_and_starts_one_member(self, harness: Harness) -> None:
        h = harness
        m = member("launch", seconds=1, says="launched")
        h.backend.launch(h.spec(m))
        h.backend.launch(h.spec(m))  # a retry, as after a crash between a launch and its record
        assert until(h, m.alloc, ended, "to run and end") == Observed(m.alloc, False, 0)
        assert [a for a in observed(h.backend) if a.startswith("launch-")] == [m.alloc]
        if h.output:  # a second member would have said it too, into the same log
            assert h.backend.read_log(m.workload_id, 0, 0, 1024) == b"launched\n"
        h.backend.forget(m.alloc)

    def test_stop_ends_a_running_member_and_is_a_no_op_otherwise(self, harness: Harness) -> None:
        h = harness
        h.backend.stop("never-launched-0-0", force=False)
        h.backend.stop("never-launched-0-0", force=True)
        m = member("stop")
        launch_running(h, m)
        h.backend.stop(m.alloc, force=False)
        h.backend.stop(m.alloc, force=True)
        until(h, m.alloc, lambda o: o is None or not o.alive, "to end once stopped")
        h.backend.stop(m.alloc, force=True)  # stopping what has ended changes nothing
        h.backend.forget(m.alloc)
        until(h, m.alloc, lambda o: o is None, "to be forgotten")

    def test_logs_are_bytes_from_an_offset_up_to_a_limit(self, harness: Harness) -> None:
        h = harness
        assert h.backend.read_log(999_999, 0, 0, 1024) == b""  # no such workload: empty, not an error
        m = member("logs", seconds=3600, says="hello from the contract")
        launch_running(h, m)
        if h.output:
            said = wait_for(lambda: h.backend.read_log(m.workload_id, 0, 0, 1 << 20), DEADLINE_S, "its output")
            assert said == b"hello from the contract\n"
        whole = h.backend.read_log(m.workload_id, 0, 0, 1 << 20)
        assert h.backend.read_log(m.workload_id, 0, 6, 4) == whole[6:10]
        assert h.backend.read_log(m.workload_id, 0, len(whole), 1024) == b""
        assert h.backend.read_log(m.workload_id, 1, 0, 1024) == b""  # no such rank
        end(h, m)

    def test_health_follows_a_serving_member(self, harness: Harness) -> None:
        h = harness
        m = member("health", port=free_port())
        launch_running(h, m)
        wait_for(lambda: h.backend.healthy(m.alloc, m.port), DEADLINE_S, f"{m.alloc} to answer on its port")
        h.backend.stop(m.alloc, force=True)
        wait_for(lambda: not h.backend.healthy(m.alloc, m.port), DEADLINE_S, f"{m.alloc} to be unhealthy once stopped")
        end(h, m)

    def test_telemetry_samples_running_members_and_known_devices(self, harness: Harness) -> None:
        h = harness
        m = member("telemetry")
        launch_running(h, m)
        if h.sampled:
            wait_for(lambda: m.alloc in h.backend.sample().members, DEADLINE_S, f"{m.alloc} to be sampled")
        sample = h.backend.sample()
        running = {a for a, o in observed(h.backend).items() if o.alive}
        assert set(sample.members) <= running
        for got in sample.members.values():
            assert 0 <= got.util_pct <= 100 and got.memory_used_mib >= 0, got
        devices = {(n.name, d.index) for n in h.backend.inventory() for d in n.devices}
        seen = [(d.node, d.index) for d in sample.devices]
        assert len(set(seen)) == len(seen) and set(seen) <= devices
        assert all(0 <= d.util_pct <= 100 and d.memory_used_mib >= 0 for d in sample.devices)
        end(h, m)
        wait_for(lambda: m.alloc not in h.backend.sample().members, DEADLINE_S, f"{m.alloc} to leave the sample")
