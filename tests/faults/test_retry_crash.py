"""kill -9 right after a cycle committed a retry: the restarted server neither loses the retry nor decides it
again (the attempt's end, the retry and its event are one write; the next attempt launches once)."""

from __future__ import annotations

from collections.abc import Callable

from gpupool.models.attempts import RetryPolicy
from gpupool.models.schemas import WorkloadCreate
from tests.e2e.conftest import Server, wait_for
from tests.faults.conftest import check_invariants, died, launches, member_sessions, recording, start_armed, workloads

FaultServer = Callable[..., Server]


def test_a_kill_after_a_retry_is_committed_neither_loses_nor_doubles_it(fault_server: FaultServer) -> None:
    s = fault_server(None)
    then = "until [ -e go ]; do sleep 0.05; done; exit 4"
    body = WorkloadCreate(project="p", name="flaky", gpus=1, command=recording(then),
                          retry=RetryPolicy(max_retries=1, backoff_s=0))  # fmt: skip
    wid = s.client().submit(body).id
    s.wait_state("flaky", "running")
    s.kill()
    # Its first attempt fails while the server is down; the next server's first cycle decides the retry.
    (s.data_dir / "workloads" / str(wid) / "go").touch()
    wait_for(lambda: member_sessions(s.data_dir) == {}, 20, "the first attempt to fail")
    died(start_armed(s, "cycle.after-persist=kill"))
    [row] = workloads(s)
    assert (row.state, row.hold, row.attempt, row.retry_at is not None) == ("pending", True, 1, True)
    assert [(a["number"], a["outcome"], a["exit_code"], a["retried"]) for a in row.attempts] == [(1, "failed", 4, True)]

    start_armed(s, None)
    s.wait_state("flaky", "failed")
    d = s.client().describe("flaky")
    assert [(a.number, a.outcome, a.exit_code, a.retried) for a in d.attempts] == [
        (1, "failed", 4, True), (2, "failed", 4, False),
    ]  # fmt: skip
    assert [e.code for e in d.events].count("retrying") == 1
    assert launches(s) == {f"{wid}-0-0": 1, f"{wid}-1-0": 1}
    check_invariants(s)
