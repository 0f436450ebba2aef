"""A real gpupool server process with simulated GPUs, on SQLite and on PostgreSQL, driven by the CLI and client."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, sync_playwright

from gpupool.backends.local import images, netns
from gpupool.client import Client
from tests import uids
from tests.e2e.postgres import Postgres

GPUPOOL = str(Path(sys.executable).parent / "gpupool")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll `check` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")


class Server:
    def __init__(self, root: Path, db_url: str | None, gpus: str, args: tuple[str, ...]) -> None:
        self.root = root
        self.data_dir = root / "data"
        self.db_url = db_url
        self.gpus = gpus
        self.args = args
        self.port = free_port()
        self.uid_base = uids.next_base(self.data_dir)
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._admin_token: str | None = None
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_") and k != "XDG_CONFIG_HOME"} | {
            "XDG_CONFIG_HOME": str(root / "config")
        }
        # The CLI runs where a user would: an empty directory of its own, which a submit uploads as the job's
        # code (not the repository the tests run from).
        self.cwd = root / "cwd"
        self.cwd.mkdir(parents=True, exist_ok=True)

    def start(self) -> Server:
        cmd = [GPUPOOL, "server", "--data-dir", str(self.data_dir), "--port", str(self.port), "--gpus", self.gpus]
        cmd += ["--db", self.db_url] if self.db_url else []
        cmd += ["--interval", "0.5", "--grace", "2", "--uid-base", str(self.uid_base), *self.args]
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 - the server keeps it for its whole life
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        wait_for(self._healthy, 60, f"the server to answer (log: {self.root / 'server.log'})")
        if self._admin_token is None:  # the server removes the file once the token is first used
            self._admin_token = (self.data_dir / "admin-token").read_text().strip()
        return self

    def _healthy(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"server exited with {self.proc.returncode}: {self.log()[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True
        except OSError:
            return False

    def log(self) -> str:
        return (self.root / "server.log").read_text(errors="replace")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Stop the server process only: workloads it started keep running, as after a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)
        self.proc = None

    @property
    def admin_token(self) -> str:
        assert self._admin_token is not None, "the server has not started"
        return self._admin_token

    def client(self, token: str | None = None) -> Client:
        return Client(self.url, token or self.admin_token)

    def cli(self, *args: str, token: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = self.env | {"GPUPOOL_URL": self.url, "GPUPOOL_TOKEN": token or self.admin_token}
        done = subprocess.run([GPUPOOL, *args], env=env, capture_output=True, text=True, timeout=60, cwd=self.cwd)
        if check and done.returncode != 0:
            raise AssertionError(f"gpupool {' '.join(args)} failed ({done.returncode}): {done.stderr}{done.stdout}")
        return done

    def json(self, *args: str, token: str | None = None) -> Any:
        return json.loads(self.cli(*args, "-o", "json", token=token).stdout)

    def workload(self, name: str, token: str | None = None) -> dict[str, Any]:
        return dict(self.json("describe", name, token=token))

    def wait_state(self, name: str, *states: str, timeout: float = 30.0) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            w = self.client(None).describe(name)
            return w.model_dump() if w.state in states else None

        return dict(wait_for(check, timeout, f"{name} to be {' or '.join(states)}"))

    def stop_workloads(self) -> None:
        """Kill every process group the server started, and remove its containers: podman's own process for one
        outlives the member's wrapper (tests leave nothing behind)."""
        for rec in (self.data_dir / "run").glob("*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                os.killpg(int(json.loads(rec.read_text())["pid"]), signal.SIGKILL)
        containers = self.data_dir / "containers"
        for marker in containers.iterdir() if containers.is_dir() else ():
            images.remove(images.name(marker.name, self.data_dir))
        netns.sweep(self.data_dir / "netns")  # their networks, and the NAT each has


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str | None:
    if request.param == "sqlite":
        return None
    pg: Postgres = request.getfixturevalue("postgres")
    return pg.new_database()


class Servers:
    """The servers one test starts, each in its own folder; `close` kills them and what they started."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[Server] = []

    def start(self, db_url: str | None, gpus: str, args: tuple[str, ...]) -> Server:
        root = self.tmp_path / f"server{len(self.started)}"
        root.mkdir()
        s = Server(root, db_url, gpus, args)
        self.started.append(s)
        return s.start()

    def close(self) -> None:
        for s in self.started:
            s.kill()
            s.stop_workloads()


@pytest.fixture
def make_server(tmp_path: Path, db_url: str | None) -> Iterator[Callable[..., Server]]:
    servers = Servers(tmp_path)

    def make(gpus: str = "fake:4xH100-80GB", *args: str) -> Server:
        return servers.start(db_url, gpus, args)

    yield make
    servers.close()


@pytest.fixture
def org_server(make_server: Callable[..., Server]) -> Server:
    """4 simulated H100s; department research (4 GPUs) with projects vision and nlp (2 each)."""
    s = make_server("fake:4xH100-80GB")
    s.cli("department", "create", "research", "--deserved-gpus", "4")
    s.cli("project", "create", "vision", "--department", "research", "--deserved-gpus", "2")
    s.cli("project", "create", "nlp", "--department", "research", "--deserved-gpus", "2")
    return s


def which_or_fail(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise AssertionError(f"{name} is not installed; scripts/test installs it")
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's chromium, driven by Playwright (the portal's tests, and the fleet's GPU map)."""
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=which_or_fail("chromium"), args=["--no-sandbox"])
        yield b
        b.close()
