"""A TCP relay in front of the API server that a test can cut and restore: a backend that reaches the API
server through it sees its connections reset and new ones refused, then the API server back."""

from __future__ import annotations

import contextlib
import socket
import threading

import yaml

from tests.kubernetes.cluster import Cluster, _port


class Gate:
    def __init__(self, cluster: Cluster) -> None:
        self.target = ("127.0.0.1", cluster.port)
        self.port = _port()
        self.kubeconfig = cluster.root / f"kubeconfig-gate-{self.port}"
        config = yaml.safe_load(cluster.kubeconfig.read_text())
        config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        self.kubeconfig.write_text(yaml.safe_dump(config))
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._open: list[socket.socket] = []

    def open(self) -> Gate:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def cut(self) -> None:
        """Refuse new connections and reset every open one."""
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._open = self._open, []
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the thread in accept(), which would hold the port
            listener.close()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # cut
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    server.close()
                    return
                self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)
