"""The server (root) reaches a member's app through the member's own socket only: the tenant owns its app directory
and may leave a link there where its socket was, to another project's notebook or to a socket of root's, which the
proxy and the health check would have followed by name (gpupool.backends.appsock)."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from gpupool.backends import appsock
from gpupool.backends.base import AppEndpoint
from gpupool.backends.local.apps import answers_http
from tests.e2e.conftest import Server, wait_for

SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
TENANT = 1_900_000_777

# The tenant's service: a real server on its port, then, told to, its socket swapped for a link to `$1`.
SWAP = (
    'python3 -m http.server "$PORT" --bind 127.0.0.1 & '
    "while [ ! -e go ]; do sleep 0.1; done; "
    'rm -f /run/gpupool/app.sock; ln -s "$1" /run/gpupool/app.sock; echo SWAPPED; wait'
)


@pytest.fixture
def root_socket(tmp_path: Path) -> Iterator[tuple[Path, socket.socket]]:
    """A socket of root's on the host (the container engine's, say), listening, that records who connects."""
    path = tmp_path / "root.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    server.setblocking(False)
    with server:
        yield path, server


def _connections(server: socket.socket) -> int:
    n = 0
    while True:
        try:
            conn, _ = server.accept()
        except BlockingIOError:
            return n
        conn.close()
        n += 1


@pytest.fixture
def app_dir() -> Iterator[Path]:
    """A member's app directory, its own, where the member can reach it (pytest's directories are root's alone)."""
    top = Path(tempfile.mkdtemp(prefix="gpupool-appsock-"))
    try:
        top.chmod(0o711)
        d = top / "7-0-0"
        d.mkdir()
        os.chown(d, TENANT, TENANT)
        d.chmod(0o700)
        yield d
    finally:
        shutil.rmtree(top)


def test_a_link_where_the_socket_was_is_never_followed(app_dir: Path, root_socket: tuple[Path, socket.socket]) -> None:
    target, server = root_socket
    sock = app_dir / "app.sock"
    sock.symlink_to(target)
    os.lchown(sock, TENANT, TENANT)
    with pytest.raises(appsock.NotTheApp, match="not a socket"), appsock.pinned(str(sock)):
        pass
    assert answers_http(AppEndpoint(uds=str(sock))) is False
    assert _connections(server) == 0


def test_a_socket_the_member_does_not_own_is_refused_and_its_own_is_reached(app_dir: Path) -> None:
    d = app_dir
    # Root's socket moved into the member's directory: not the member's.
    theirs = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    theirs.bind(str(d / "app.sock"))
    theirs.listen(1)
    with theirs, pytest.raises(appsock.NotTheApp, match=f"belongs to uid 0, not to its member \\({TENANT}\\)"):
        appsock.connect(str(d / "app.sock"), 1.0)
    (d / "app.sock").unlink()
    # The member's own, bound as the member: reached, its listener's uid checked.
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the member
        try:
            os.setgid(TENANT)
            os.setuid(TENANT)
            own = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            own.bind(str(d / "app.sock"))
            own.listen(1)
            os.write(ready_w, b"x")
            conn, _ = own.accept()
            conn.recv(64)
            conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n")
            conn.close()
        finally:
            os._exit(0)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"x"
    os.close(ready_r)
    try:
        assert answers_http(AppEndpoint(uds=str(d / "app.sock")), timeout_s=5.0) is True
    finally:
        os.waitpid(pid, 0)


@SQLITE
def test_the_exploit_a_link_to_another_projects_app_or_roots_socket_gets_the_proxy_nowhere(
    make_server: Callable[..., Server], root_socket: tuple[Path, socket.socket]
) -> None:
    host_socket, server = root_socket
    s = make_server("fake:2xH100-80GB")
    for project in ("red", "blue"):
        s.cli("project", "create", project, "--deserved-gpus", "1")
        s.cli("project", "set", project, "--production-allowed")
    rita = str(s.json("user", "create", "rita", "--project", "red")["token"])
    bob = str(s.json("user", "create", "bob", "--project", "blue")["token"])
    # The victim: another project's service, which answers its own members with its secret.
    s.cli("submit", "-p", "blue", "--type", "inference", "--name", "notes", "--port", "8123", "--",
          "sh", "-c", 'echo classified > index.html; exec python3 -m http.server "$PORT"', token=bob)  # fmt: skip
    victim = s.wait_state("notes", "running", timeout=60)
    mine = {"Authorization": f"Bearer {bob}"}
    page = f"{s.url}/apps/blue/notes/index.html"
    assert wait_for(lambda: httpx.get(page, headers=mine).text, 30, "blue's notes") == "classified\n"
    victim_socket = next(Path("/run/gpupool").glob(f"*/{victim['id']}-0-0/app.sock"))

    for name, target in (("peek", victim_socket), ("engine", host_socket)):
        s.cli("submit", "-p", "red", "--type", "inference", "--name", name, "--port", "8000", "--",
              "sh", "-c", SWAP, "swap", str(target), token=rita)  # fmt: skip
        attacker = s.wait_state(name, "running", timeout=60)
        (s.data_dir / "workloads" / str(attacker["id"]) / "go").touch()
        wait_for(lambda n=name: "SWAPPED" in s.cli("logs", n, token=rita).stdout, 30, f"{name}'s link")  # type: ignore[misc]
        got = httpx.get(f"{s.url}/apps/red/{name}/index.html", headers={"Authorization": f"Bearer {rita}"})
        assert (got.status_code, got.json()) == (502, {"detail": f"red/{name} is not answering"})
    assert _connections(server) == 0
