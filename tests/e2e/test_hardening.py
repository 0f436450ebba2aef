"""The API's edge on a real server (uvicorn, a socket, the bytes as sent): oversized bodies, raw non-ASCII
Authorization bytes, non-finite numbers and unreadable bodies get their 4xx, and the server logs no traceback.
tests/api/test_edges.py covers the same rules case by case, in-process."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest

from gpupool.api.errors import MAX_BODY
from tests.e2e.conftest import Server, Servers


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    servers = Servers(tmp_path_factory.mktemp("hardening"))
    s = servers.start(None, "fake:2xH100-80GB", ())
    s.cli("department", "create", "research", "--deserved-gpus", "2")
    s.cli("project", "create", "vision", "--department", "research", "--deserved-gpus", "2")
    yield s
    servers.close()


def raw(server: Server, request: bytes) -> tuple[int, bytes]:
    """Send bytes as they are (asking the server to close after its answer); the status and everything after the
    status line. Not a half-close: uvicorn takes the end of a client's input as the end of the connection, and
    drops an answer not yet written by then."""
    head, sep, body = request.partition(b"\r\n\r\n")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head + b"\r\nConnection: close" + sep + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), rest


def test_a_body_declared_over_1_mib_is_refused_before_it_is_sent(server: Server) -> None:
    status, rest = raw(
        server,
        b"POST /api/v1/workloads HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {server.admin_token}\r\nContent-Length: {MAX_BODY + 1}\r\n\r\n".encode(),
    )
    assert status == 413
    assert rest.endswith(b'{"detail": "the request body is over 1048576 bytes"}')
    assert b"referrer-policy: no-referrer" in rest.lower()


def test_a_raw_latin1_byte_in_the_token_is_a_401(server: Server) -> None:
    status, rest = raw(
        server, b"GET /api/v1/whoami HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer gps_\xb2_9999999999_0\r\n\r\n"
    )
    assert status == 401
    assert b"www-authenticate: bearer" in rest.lower()
    assert rest.endswith(b'{"detail":"a valid bearer token is required"}')


def test_bad_numbers_and_bodies_get_4xx_and_the_server_logs_no_traceback(server: Server) -> None:
    h = {"Authorization": f"Bearer {server.admin_token}", "Content-Type": "application/json"}
    api = f"{server.url}/api/v1"
    answers = [
        httpx.post(f"{api}/departments", content=b'{"name": "d", "deserved_gpus": NaN}', headers=h).status_code,
        httpx.post(
            f"{api}/departments", content=b'{"name": "d", "weight": 1' + b"0" * 30 + b"}", headers=h
        ).status_code,
        httpx.post(f"{api}/departments", content=b'{"name": "\xff"}', headers=h).status_code,
        httpx.post(f"{api}/departments", content=b'{"name": ', headers=h).status_code,
        httpx.get(f"{api}/reports/usage", params={"start": "nan", "end": "inf"}, headers=h).status_code,
        httpx.get(f"{api}/workloads/{'9' * 30}", headers=h).status_code,
        httpx.get(f"{api}/workloads", params={"cursor": "²"}, headers=h).status_code,
        httpx.post(
            f"{api}/workloads", json={"project": "vision", "env": {"LD_PRELOAD": "/x.so"}}, headers=h
        ).status_code,
        httpx.get(f"{api}/whoami", headers={"Authorization": "Basic eHl6"}).status_code,
    ]
    assert answers == [422, 422, 400, 400, 422, 422, 422, 422, 401]
    assert "Traceback" not in server.log()
