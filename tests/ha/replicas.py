"""Replicas of a gpupool server on one PostgreSQL database and one data dir (the local backend, simulated GPUs),
and what the high-availability tests and the failover benchmark ask of them: which one leads, in which epoch,
how often each workload's process was started, and a stream of submits that fails over between replicas."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psycopg

from gpupool.models.schemas import WorkloadCreate
from tests.e2e.conftest import Server, wait_for

START_MARK = 'echo started >> "$GPUPOOL_WORKDIR/starts"'
"""A workload's command begins with this: its workdir's `starts` file gets a line per process start."""


def long_running(name: str, gpus: int = 1, seconds: float = 600) -> WorkloadCreate:
    return WorkloadCreate(
        project="ha", name=name, type="batch", gpus=gpus, command=["sh", "-c", f"{START_MARK}; exec sleep {seconds}"]
    )


def _pg(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True, connect_timeout=5)


class Replicas:
    """Servers on one database: replicas, or one server with --workers."""

    def __init__(self, db_url: str, servers: list[Server]) -> None:
        self.db_url = db_url
        self.servers = servers
        self.data_dir = servers[0].data_dir

    @classmethod
    def start(cls, root: Path, db_url: str, count: int, gpus: str, args: tuple[str, ...] = ()) -> Replicas:
        """`count` servers on `db_url`, sharing the first one's data dir (and its admin token)."""
        servers: list[Server] = []
        try:
            for i in range(count):
                (root / f"replica{i}").mkdir()
                s = Server(root / f"replica{i}", db_url, gpus, ("--single-user", *args))
                if servers:
                    s.data_dir = servers[0].data_dir
                    s._admin_token = servers[0].admin_token
                servers.append(s)
                s.start()
        except BaseException:
            cls(db_url, servers).close()
            raise
        return cls(db_url, servers)

    @property
    def admin_token(self) -> str:
        return self.servers[0].admin_token

    def lease(self) -> tuple[int, int] | None:
        """(epoch, holder's pid) of the scheduler's lease; None before anyone took it."""
        with _pg(self.db_url) as c:
            row = c.execute("SELECT epoch, holder FROM leases WHERE name = 'scheduler'").fetchone()
        return None if row is None else (int(row[0]), int(str(row[1]).split(":")[-2]))

    def leader(self) -> Server:
        lease = self.lease()
        assert lease is not None, "nobody holds the lease"
        found = [s for s in self.servers if s.proc is not None and s.proc.pid == lease[1]]
        assert len(found) == 1, f"the lease's holder (pid {lease[1]}) is none of the replicas"
        return found[0]

    def wait_for_new_leader(self, epoch: int, timeout: float) -> Server:
        """The replica that holds the lease in an epoch after `epoch` (polled until `timeout`)."""
        wait_for(lambda: (self.lease() or (0, 0))[0] > epoch, timeout, f"a leader after epoch {epoch}")
        return self.leader()

    def names(self) -> Counter[str]:
        """How many rows each workload name has in the store."""
        with _pg(self.db_url) as c:
            return Counter(str(r[0]) for r in c.execute("SELECT name FROM workloads"))

    def running(self, via: Server | None = None) -> dict[str, tuple[int, list[int]]]:
        """Running workloads: name → (id, devices), as `via` (default: the first replica alive) tells."""
        with (via or self.alive()).client() as c:
            return {w.name: (w.id, list(w.devices)) for w in c.list_workloads(state="running")}

    def alive(self) -> Server:
        return next(s for s in self.servers if s.proc is not None)

    def starts(self, workload_id: int) -> int:
        path = self.data_dir / "workloads" / str(workload_id) / "starts"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def close(self) -> None:
        for s in self.servers:
            if s.proc is not None and s.proc.poll() is None:
                os.kill(s.proc.pid, signal.SIGCONT)  # a paused one must be able to die
            s.kill()
        self.servers[0].stop_workloads()


class Storm:
    """Submits `count` long-running workloads, one every `pace_s`, each with its own Idempotency-Key, to the first
    replica that answers; a refused or lost request is sent again (same key) to the next replica until one
    acknowledges it. `acknowledged` is the names acknowledged (201 or 200), in order."""

    def __init__(
        self, urls: list[str], token: str, count: int, pace_s: float, prefix: str = "s", seconds: float = 600
    ) -> None:
        self.urls = urls
        self.seconds = seconds
        self.token = token
        self.count = count
        self.pace_s = pace_s
        self.prefix = prefix
        self.acknowledged: list[str] = []
        self.retries = 0
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Storm:
        self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the storm did not finish within {timeout:g}s"
        assert not self.errors, self.errors

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(headers=headers, timeout=5) as http:
            for i in range(self.count):
                name = f"{self.prefix}{i}"
                target = i  # alternate: every replica takes submits
                body = long_running(name, seconds=self.seconds).model_dump(mode="json", exclude_none=True)
                deadline = time.monotonic() + 60
                while True:
                    url = self.urls[target % len(self.urls)]
                    try:
                        r = http.post(f"{url}/api/v1/workloads", json=body, headers={"Idempotency-Key": name})
                        if r.status_code in (200, 201):
                            self.acknowledged.append(name)
                            break
                        if r.status_code < 500:
                            self.errors.append(f"{name}: {r.status_code} {r.text}")
                            return
                    except httpx.HTTPError:
                        pass
                    self.retries += 1
                    target += 1
                    if time.monotonic() > deadline:
                        self.errors.append(f"{name}: no replica acknowledged it within 60 s")
                        return
                    time.sleep(0.05)
                time.sleep(self.pace_s)
