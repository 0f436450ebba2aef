"""Whether a member's notebook or service answers HTTP yet, on its socket or port."""

from __future__ import annotations

import contextlib
import socket

from gpupool.backends.base import AppEndpoint


def answers_http(endpoint: AppEndpoint, timeout_s: float = 0.5) -> bool:
    """True once something answers a request with an HTTP status line. A socket that accepts and then closes
    (a bridge whose service is not listening yet) does not count."""
    with contextlib.suppress(OSError):
        if endpoint.uds is not None:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(timeout_s)
            target: str | tuple[str, int] = endpoint.uds
        else:
            conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            conn.settimeout(timeout_s)
            target = (endpoint.host or "127.0.0.1", int(endpoint.port or 0))
        with conn:
            conn.connect(target)
            conn.sendall(b"HEAD / HTTP/1.0\r\nHost: localhost\r\n\r\n")
            return conn.recv(5) == b"HTTP/"
    return False
