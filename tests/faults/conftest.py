"""Fault tests: servers started with failpoints, and the invariants every fault must leave intact.

`check_invariants` reads the server's store and this host. What it holds, whatever was killed and when:
every acknowledged submit is in the store exactly once; no device on a node is promised past its capacity;
every workload and allocation is in a legal state; and no member was launched twice (workloads started with
`recording` append their allocation id to a file in their working directory when they start; a member also
never runs as two process groups, and nothing runs for a member the store has not launched or has ended).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import psutil
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.failpoints import ENV
from gpupool.lifecycle.phases import HOLDING, LIVE, STARTED, TERMINAL, AllocPhase, Phase, StopReason
from gpupool.models.schemas import ProjectCreate
from gpupool.store.engine import make_engine
from gpupool.store.tables import NodeRow, WorkloadRow
from tests.e2e.conftest import Server, Servers, db_url, wait_for

__all__ = ["db_url"]  # the SQLite/PostgreSQL parametrisation, shared with the end-to-end tests

DEVICE_MILLI = 1000
STARTS = "starts"
LEASE_TTL_S = 4


def store_url(s: Server) -> str:
    return s.db_url or f"sqlite:///{s.data_dir / 'gpupool.db'}"


def workloads(s: Server) -> list[WorkloadRow]:
    """Every workload in the server's store, with its allocations (detached: read them, do not write)."""
    engine = make_engine(store_url(s))
    try:
        with Session(engine) as session:
            return list(session.scalars(select(WorkloadRow).order_by(WorkloadRow.id)))
    finally:
        engine.dispose()


def states(s: Server) -> dict[str, str]:
    return {w.name: w.state for w in workloads(s)}


def recording(then: str) -> list[str]:
    """A workload command that notes its allocation id in its working directory (the one place a sandboxed
    member may write) when it starts, then runs `then` (sh)."""
    return ["sh", "-c", f'echo "$GPUPOOL_ALLOCATION" >> {STARTS}; {then}']


def launches(s: Server) -> Counter[str]:
    """How many times each allocation of `recording` workloads started."""
    return Counter(x for f in (s.data_dir / "workloads").glob(f"*/{STARTS}") for x in f.read_text().split())


def member_sessions(data_dir: Path) -> dict[str, set[int]]:
    """The process sessions running each allocation of the server with this data dir (one per launch)."""
    where = str(data_dir / "workloads") + os.sep
    found: dict[str, set[int]] = defaultdict(set)
    for p in psutil.process_iter(["pid", "environ", "status"], ad_value=None):
        env = p.info["environ"] or {}
        if p.info["status"] == psutil.STATUS_ZOMBIE or not env.get("GPUPOOL_WORKDIR", "").startswith(where):
            continue
        with contextlib.suppress(ProcessLookupError):
            found[env["GPUPOOL_ALLOCATION"]].add(os.getsid(p.info["pid"]))
    return dict(found)


def _state_violations(w: WorkloadRow) -> list[str]:
    out: list[str] = []
    try:
        phase = Phase(w.state)
    except ValueError:
        return [f"workload {w.name}: unknown state {w.state!r}"]
    if w.stop_reason is not None and (w.stop_reason not in set(StopReason) or phase not in LIVE):
        out.append(f"workload {w.name}: stop reason {w.stop_reason!r} while {w.state}")
    if phase in TERMINAL and w.finished_at is None:
        out.append(f"workload {w.name}: {w.state} without a finish time")
    current = [a for a in w.allocations if a.attempt == w.attempt]
    for a in w.allocations:
        if a.state not in set(AllocPhase):
            out.append(f"allocation {a.id}: unknown state {a.state!r}")
        elif a.state != AllocPhase.ENDED and (phase not in LIVE or a.attempt != w.attempt):
            out.append(f"allocation {a.id}: {a.state} while its workload is {w.state} at attempt {w.attempt}")
    if phase in LIVE and len(current) != w.workers:
        out.append(f"workload {w.name}: {w.state} with {len(current)} members of {w.workers}")
    if phase == Phase.RUNNING and any(a.state == AllocPhase.BOUND for a in current):
        out.append(f"workload {w.name}: running with a member never launched")
    return out


def _capacity_violations(rows: list[WorkloadRow], nodes: Mapping[str, NodeRow]) -> list[str]:
    milli: Counter[tuple[str, int]] = Counter()
    memory: Counter[tuple[str, int]] = Counter()
    for a in (a for w in rows for a in w.allocations if a.state in HOLDING):
        for d in a.devices:
            milli[a.node, int(d["index"])] += int(d["milli"])
            memory[a.node, int(d["index"])] += int(d["memory_mib"])
    out: list[str] = []
    for (node, index), used in sorted(milli.items()):
        capacity = next((int(d["memory_mib"]) for d in nodes[node].devices if int(d["index"]) == index), 0)
        if used > DEVICE_MILLI or memory[node, index] > capacity:
            out.append(f"device {node}/{index}: {used} milli and {memory[node, index]} MiB of {capacity} promised")
    return out


def violations(s: Server, acked: Mapping[str, int] | None = None) -> list[str]:
    """What breaks the invariants now: acknowledged submits (Idempotency-Key to the id it was acknowledged
    with) lost or doubled, devices over-committed, illegal states, members launched or running twice."""
    engine = make_engine(store_url(s))
    try:
        with Session(engine) as session:
            rows = list(session.scalars(select(WorkloadRow).order_by(WorkloadRow.id)))
            nodes = {n.name: n for n in session.scalars(select(NodeRow))}
    finally:
        engine.dispose()
    out = [v for w in rows for v in _state_violations(w)]
    out += _capacity_violations(rows, nodes)
    by_key: dict[str, list[int]] = defaultdict(list)
    for w in rows:
        if w.idempotency_key is not None:
            by_key[w.idempotency_key].append(w.id)
    for key, wid in sorted((acked or {}).items()):
        if by_key.get(key) != [wid]:
            out.append(f"submit {key} was acknowledged as workload {wid}; the store holds {by_key.get(key, [])}")
    allocs = {a.id: a for w in rows for a in w.allocations}
    for alloc_id, n in sorted(launches(s).items()):
        if n > 1:
            out.append(f"allocation {alloc_id} started {n} times")
    for alloc_id, sessions in sorted(member_sessions(s.data_dir).items()):
        if len(sessions) > 1:
            out.append(f"allocation {alloc_id} runs as {len(sessions)} process groups")
        state = allocs[alloc_id].state if alloc_id in allocs else None
        if state not in STARTED:
            out.append(f"allocation {alloc_id} runs while the store has it {state}")
    return out


def check_invariants(s: Server, acked: Mapping[str, int] | None = None) -> None:
    found = violations(s, acked)
    assert not found, "invariants broken:\n" + "\n".join(found)


def kill_members(data_dir: Path) -> None:
    """Kill whatever still runs for a server's members (its run records may be gone or never written)."""
    for sessions in member_sessions(data_dir).values():
        for sid in sessions:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(sid, signal.SIGKILL)


def died(s: Server, timeout: float = 30.0) -> None:
    """Wait for a server a `kill` failpoint stops; it must have died of SIGKILL (not of a bug)."""
    proc = s.proc
    assert proc is not None
    wait_for(lambda: proc.poll() is not None, timeout, "the failpoint to kill the server")
    assert proc.returncode == -signal.SIGKILL, f"server exited with {proc.returncode}: {s.log()[-3000:]}"
    s.proc = None


def start_armed(s: Server, failpoints: str | None) -> Server:
    """Start a stopped server again (same data dir and store) with these failpoints armed (None: none). The
    scheduler loop starts before the API answers, so a `kill` at its first cycle may stop it first: then this
    returns all the same, for `died` to confirm."""
    if failpoints:
        s.env[ENV] = failpoints
    else:
        s.env.pop(ENV, None)
    try:
        s.start()
    except AssertionError:
        if s.proc is None or s.proc.returncode != -signal.SIGKILL:
            raise
    return s


@pytest.fixture
def fault_server(tmp_path: Path, db_url: str | None) -> Iterator[Callable[..., Server]]:
    """Starts a server with the failpoints armed (`name=kill|raise[@N],...`; None: none) and project `p`
    deserving its 4 GPUs; on teardown kills the servers and every member they started."""
    servers = Servers(tmp_path)

    def start(failpoints: str | None, gpus: str = "fake:4xH100-80GB", *args: str) -> Server:
        root = tmp_path / f"server{len(servers.started)}"
        root.mkdir()
        s = Server(root, db_url, gpus, args)
        # A server killed while it led holds PostgreSQL's lease until it runs out; its successor waits for that.
        s.env["GPUPOOL_LEASE_TTL_S"] = str(LEASE_TTL_S)
        if failpoints:
            s.env[ENV] = failpoints
        servers.started.append(s)
        s.start().client().create_project(ProjectCreate(name="p", deserved_gpus=4))
        return s

    yield start
    servers.close()
    for s in servers.started:
        kill_members(s.data_dir)
