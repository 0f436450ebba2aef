"""kill -9 in the middle of a launch: after its intent is durable but before the process starts, and after the
process starts but before its record is written. A restarted server (same data dir and store, no failpoint)
runs the member exactly once, keeps its device to it while it runs (the next workload waits), and records how
it really ended."""

from __future__ import annotations

import json
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from gpupool.failpoints import ENV
from gpupool.models.schemas import WorkloadCreate
from tests.e2e.conftest import Server, wait_for
from tests.faults.conftest import check_invariants, member_sessions

FaultServer = Callable[..., Server]


def _submit(s: Server, name: str, then: str) -> str:
    """A one-GPU workload that notes its allocation id in `starts` in its working directory (the one place a
    sandboxed member may write) when it starts, then runs `then` (sh); returns its member's allocation id."""
    command = ["sh", "-c", f'echo "$GPUPOOL_ALLOCATION" >> starts; {then}']
    wid = s.client().submit(WorkloadCreate(project="p", name=name, gpus=1, command=command)).id
    return f"{wid}-0-0"


def launches(s: Server) -> Counter[str]:
    """How many times each allocation started."""
    return Counter(x for f in (s.data_dir / "workloads").glob("*/starts") for x in f.read_text().split())


def _waiting(s: Server) -> tuple[str, Path]:
    """Workload `w`, which runs until a file `go` appears in its working directory; its allocation and `go`."""
    wait_for(lambda: s.client().nodes(), 20, "the host's node to be registered")  # else `w` could never fit
    alloc = _submit(s, "w", "while [ ! -e go ]; do sleep 0.05; done")
    return alloc, s.data_dir / "workloads" / alloc.split("-")[0] / "go"


def died(s: Server) -> None:
    """The failpoint killed the server (SIGKILL, not a bug)."""
    proc = s.proc
    assert proc is not None
    wait_for(lambda: proc.poll() is not None, 30, "the failpoint to kill the server")
    assert proc.returncode == -signal.SIGKILL, f"server exited with {proc.returncode}: {s.log()[-3000:]}"
    s.proc = None


def restart(s: Server) -> None:
    s.env.pop(ENV, None)
    s.start()


def _finish_after_restart(s: Server, go: Path, alloc: str) -> None:
    """With `w` running again on the host's only GPU: a second workload waits for it, and runs once it is done."""
    restart(s)
    s.wait_state("w", "running")
    nxt = _submit(s, "next", "exit 0")
    wait_for(lambda: s.workload("next")["reason_code"] == "no-node-fits", 20, "next to wait for the GPU")
    check_invariants(s)
    go.touch()
    assert s.wait_state("w", "succeeded")["state"] == "succeeded"
    s.wait_state("next", "succeeded")
    assert launches(s) == {alloc: 1, nxt: 1}
    assert member_sessions(s.data_dir) == {}
    check_invariants(s)


def test_a_kill_after_the_start_before_the_record_adopts_the_member_by_its_lock(fault_server: FaultServer) -> None:
    s = fault_server("launch.after-start=kill", "fake:1xH100-80GB")
    alloc, go = _waiting(s)
    died(s)
    wait_for(lambda: launches(s) == {alloc: 1}, 20, "the member to start")
    record = json.loads((s.data_dir / "run" / f"{alloc}.json").read_text())
    assert "pid" not in record  # the intent alone: the server died before it wrote more
    assert list(member_sessions(s.data_dir)) == [alloc]
    _finish_after_restart(s, go, alloc)


def test_a_kill_after_the_intent_before_the_start_starts_the_member_once_after_restart(
    fault_server: FaultServer,
) -> None:
    s = fault_server("launch.before-start=kill", "fake:1xH100-80GB")
    alloc, go = _waiting(s)
    died(s)
    assert (s.data_dir / "run" / f"{alloc}.json").exists()  # the intent is durable
    assert launches(s) == {}
    assert member_sessions(s.data_dir) == {}
    _finish_after_restart(s, go, alloc)
