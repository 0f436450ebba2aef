"""Where members' notebooks and services are reached (their sockets' directories), and whether they answer HTTP yet."""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
from pathlib import Path

from gpupool.backends import appsock
from gpupool.backends.base import AppEndpoint


def answers_http(endpoint: AppEndpoint, timeout_s: float = 0.5) -> bool:
    """True once something answers a request with an HTTP status line. A socket that accepts and then closes
    (a bridge whose service is not listening yet) does not count."""
    with contextlib.suppress(OSError):
        if endpoint.uds is not None:
            conn = appsock.connect(endpoint.uds, timeout_s)  # the member's own socket, never what it links to
        else:
            conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            conn.settimeout(timeout_s)
            conn.connect((endpoint.host or "127.0.0.1", int(endpoint.port or 0)))
        with conn:
            conn.sendall(b"HEAD / HTTP/1.0\r\nHost: localhost\r\n\r\n")
            return conn.recv(5) == b"HTTP/"
    return False


def apps_root(data_dir: Path) -> Path:
    """Where members' app sockets live. A socket's path has at most 107 bytes, which a data dir deep in a tree
    can exceed; a root server keeps them short under /run, keyed by its data dir."""
    if os.geteuid() != 0:
        root = data_dir / "apps"
    else:
        key = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:16]
        Path("/run/gpupool").mkdir(mode=0o700, exist_ok=True)
        root = Path("/run/gpupool") / key
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return root
