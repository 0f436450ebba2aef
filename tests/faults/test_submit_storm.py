"""Storms. A submit storm through crashes: 8 clients submit with an Idempotency-Key each, retrying on connection errors
and 5xx until acknowledged, while the server is killed -9 three times at seeded moments and restarted. No
acknowledged submit is lost, none is stored twice, a replay of a key gives its workload back, and every
workload runs exactly once. And a burst of launches, all at once."""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable

import pytest

from gpupool.client import Client
from gpupool.client.client import ApiError
from gpupool.lifecycle.phases import TERMINAL
from gpupool.models.schemas import WorkloadCreate
from tests.e2e.conftest import Server, wait_for
from tests.faults.conftest import check_invariants, launches, recording, start_armed, workloads

SEED = 16
CLIENTS = 8
SUBMITS = 64  # 8 a client: three kills land among them at seeded moments all the same
KILLS = 3
BURSTS = 4
BODY = WorkloadCreate(project="p", gpu=0.25, command=recording("sleep 0.2"))


class Storm:
    """What the clients were told: every reply's workload id, per key, and what they could not retry."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.lock = threading.Lock()
        self.ids: dict[str, set[int]] = defaultdict(set)
        self.retried = 0
        self.refused: list[str] = []

    def acked(self) -> int:
        with self.lock:
            return len(self.ids)

    def submit(self, c: Client, key: str, deadline: float) -> None:
        while True:
            try:
                w = c.submit(BODY, idempotency_key=key)
            except ApiError as e:
                if (e.status == 0 or e.status >= 500) and time.monotonic() < deadline:
                    with self.lock:
                        self.retried += 1
                    time.sleep(0.05)  # a client's back-off, not a wait for the server
                    continue
                with self.lock:
                    self.refused.append(f"{key}: {e}")
                return
            with self.lock:
                self.ids[key].add(w.id)
            return

    def client(self, keys: list[str], deadline: float) -> None:
        with Client(self.url, self.token, timeout=10) as c:
            for key in keys:
                self.submit(c, key, deadline)


def test_a_submit_storm_through_three_crashes_loses_and_doubles_nothing(fault_server: Callable[..., Server]) -> None:
    rng = random.Random(SEED)
    s = fault_server(None)
    storm = Storm(s.url, s.admin_token)
    keys = [f"storm-{i:03d}" for i in range(SUBMITS)]
    deadline = time.monotonic() + 120
    threads = [
        threading.Thread(target=storm.client, args=(keys[i::CLIENTS], deadline), name=f"storm-{i}")
        for i in range(CLIENTS)
    ]
    for t in threads:
        t.start()
    for at in sorted(rng.sample(range(5, SUBMITS - 5), KILLS)):
        wait_for(lambda at=at: storm.acked() >= at, 60, f"{at} submits acknowledged")
        s.kill()
        start_armed(s, None)
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    assert storm.refused == []
    assert storm.retried > 0  # the crashes really hit the storm
    assert {k: len(v) for k, v in storm.ids.items()} == dict.fromkeys(keys, 1)
    acked = {k: v.pop() for k, v in storm.ids.items()}
    # A replay of each key, once the server is whole again, gives the workload it acknowledged.
    with s.client() as c:
        assert {k: c.submit(BODY, idempotency_key=k).id for k in keys} == acked

    def unfinished() -> dict[str, str]:
        return {w.name: w.state for w in workloads(s) if w.state != "succeeded"}

    try:
        wait_for(lambda: not unfinished(), 60, "every workload to succeed")
    except AssertionError as e:
        raise AssertionError(f"{e}; unfinished: {unfinished()}") from None
    assert len(workloads(s)) == SUBMITS
    assert launches(s) == {f"{wid}-0-0": 1 for wid in acked.values()}
    check_invariants(s, acked)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the race is the backend's, whatever the store
def test_a_burst_of_one_projects_workloads_launched_together_all_succeed(fault_server: Callable[..., Server]) -> None:
    """Forty tenth-GPU workloads of one project, freed together by a blocker's end, launch in parallel: no
    member's launch may spoil another's (a sandboxed member's identity files were replaced under it)."""
    s = fault_server(None)
    c = s.client()
    names = [f"b{burst}-{i}" for burst in range(BURSTS) for i in range(40)]
    for burst in range(BURSTS):
        go = "until [ -e go ]; do sleep 0.05; done"
        bid = c.submit(WorkloadCreate(project="p", name=f"blocker-{burst}", gpus=4, command=["sh", "-c", go])).id
        s.wait_state(f"blocker-{burst}", "running")
        for name in names[burst * 40 : (burst + 1) * 40]:
            c.submit(WorkloadCreate(project="p", name=name, gpu=0.1, command=recording("true")))
        (s.data_dir / "workloads" / str(bid) / "go").touch()

    def ended() -> dict[str, str] | None:
        found = {w.name: w.state for w in workloads(s) if w.name in names}
        return found if all(state in TERMINAL for state in found.values()) else None

    assert wait_for(ended, 60, "the bursts to end") == dict.fromkeys(names, "succeeded")
    check_invariants(s)


def test_retries_racing_their_original_submit_all_answer_its_workload(fault_server: Callable[..., Server]) -> None:
    """A client that timed out retries while its first request is still in the server: every copy of a key,
    however they interleave, is acknowledged with the one workload stored for it."""
    s = fault_server(None)
    storm = Storm(s.url, s.admin_token)
    keys = [f"race-{i}" for i in range(10)]
    for key in keys:
        together = threading.Barrier(CLIENTS)

        def copy(key: str = key, together: threading.Barrier = together) -> None:
            with Client(s.url, s.admin_token, timeout=10) as c:
                together.wait()
                storm.submit(c, key, deadline=0.0)  # no retry: each copy is the one request it sends

        threads = [threading.Thread(target=copy) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert storm.refused == []
    assert {k: len(v) for k, v in storm.ids.items()} == dict.fromkeys(keys, 1)
    assert sorted(w.idempotency_key or "" for w in workloads(s)) == keys
