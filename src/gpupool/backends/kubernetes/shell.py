"""Shells into members on Kubernetes: the API server's own exec, attach and portforward subresources of the
member's pod (its container `main`), through the kubernetes client's stream API. The API server checks nothing
of gpupool's: the server's rights checks (services.shell) come first, and the server's credentials open the
stream. A cluster where the API server cannot reach the pod's kubelet answers with an error, passed on to the
user as it is said."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
from typing import TYPE_CHECKING, Any

from gpupool.backends.shell import CHUNK, STDERR, STDOUT, Loop, ShellError, ShellSession, ShellTarget, status

if TYPE_CHECKING:
    from gpupool.backends.kubernetes.backend import KubernetesBackend

CONTAINER = "main"
POLL_S = 0.1
ERROR_CHANNEL = 3
_MESSAGE = re.compile(r'"message":\s*"((?:[^"\\]|\\.)*)"')


class KubeShells:
    def __init__(self, backend: KubernetesBackend) -> None:
        self.backend = backend

    def exec(
        self, loop: Loop, target: ShellTarget, argv: list[str], tty: bool, size: tuple[int, int] | None = None
    ) -> ShellSession:
        from kubernetes.stream import stream

        name, ns = self._pod(target)
        ws = self._open(lambda: stream(
            self.backend.core.connect_get_namespaced_pod_exec, name, ns, container=CONTAINER, command=argv,
            stdin=True, stdout=True, stderr=True, tty=tty, _preload_content=False, binary=True,
        ))  # fmt: skip
        session = _Streamed(loop, ws)
        if tty and size is not None:
            session.resize(*size)
        return session

    def attach(self, loop: Loop, target: ShellTarget) -> ShellSession:
        from kubernetes.stream import stream

        name, ns = self._pod(target)
        ws = self._open(lambda: stream(
            self.backend.core.connect_get_namespaced_pod_attach, name, ns, container=CONTAINER,
            stdin=True, stdout=True, stderr=True, tty=False, _preload_content=False, binary=True,
        ))  # fmt: skip
        return _Streamed(loop, ws, attached=True)

    def port_forward(self, loop: Loop, target: ShellTarget, port: int) -> ShellSession:
        from kubernetes.stream import portforward

        name, ns = self._pod(target)
        pf = self._open(
            lambda: portforward(self.backend.core.connect_get_namespaced_pod_portforward, name, ns, ports=str(port))
        )
        return _Forwarded(loop, pf, port)

    def _pod(self, target: ShellTarget) -> tuple[str, str]:
        watch = self.backend.watch
        with watch.lock:
            pod = watch.pods.get(target.alloc_id)
        if pod is None:
            raise ShellError(f"{target.workload} (rank {target.rank}) has no pod yet; try again")
        return str(pod["metadata"]["name"]), str(pod["metadata"]["namespace"])

    def _open(self, call: Any) -> Any:
        try:
            return call()
        except Exception as e:  # the client raises ApiException, or the websocket library's own errors
            raise ShellError(f"the cluster refused the session: {_said(e)}") from e


def _said(exc: Exception) -> str:
    """What the API server said, out of the client's wrapping of it."""
    text = str(getattr(exc, "reason", None) or getattr(exc, "body", None) or exc)
    found = _MESSAGE.findall(text)
    if found:
        with contextlib.suppress(ValueError):
            return str(json.loads(f'"{found[-1]}"'))
    return " ".join(text.split())[:300]


class _Streamed(ShellSession):
    """An exec or attach stream; its reader thread pumps the channels until it closes."""

    def __init__(self, loop: Loop, ws: Any, attached: bool = False) -> None:
        super().__init__(loop)
        self.ws = ws
        self.attached = attached
        self._lock = threading.Lock()
        threading.Thread(target=self._pump, daemon=True, name="gpupool-kube-shell").start()

    def _pump(self) -> None:
        ws = self.ws
        try:
            while ws.is_open():
                with self._lock:
                    ws.update(timeout=POLL_S)
                    out = ws.read_stdout() if ws.peek_stdout() else b""
                    err = ws.read_stderr() if ws.peek_stderr() else b""
                if out:
                    self.emit(STDOUT, out)
                if err:
                    self.emit(STDERR, err)
        except Exception as e:  # the stream broke: say so, and end the session
            self.emit(STDERR, f"the stream from the cluster broke: {_said(e)}\n".encode())
        code, message = _outcome(ws.read_channel(ERROR_CHANNEL))
        if message:
            self.emit(STDERR, f"the cluster ended the session: {message}\n".encode())
        self.exit(code)

    def write(self, data: bytes) -> None:
        with self._lock:
            self.ws.write_stdin(data)

    def resize(self, cols: int, rows: int) -> None:
        with self._lock:
            self.ws.write_channel(4, json.dumps({"Width": cols, "Height": rows}))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close()


def _outcome(raw: bytes | str) -> tuple[int | None, str | None]:
    """The exit status and the error a stream's error channel holds at its end (a metav1.Status)."""
    try:
        found = json.loads(raw or b"{}")
    except ValueError:
        return None, None
    if not isinstance(found, dict) or not found:
        return None, None
    if found.get("status") == "Success":
        return 0, None
    for cause in (found.get("details") or {}).get("causes") or ():
        if cause.get("reason") == "ExitCode" and str(cause.get("message", "")).isdigit():
            return status(int(cause["message"])), None
    return None, str(found.get("message") or found)[:500]


class _Forwarded(ShellSession):
    """One TCP connection to a port of the pod's, through the API server's portforward stream."""

    def __init__(self, loop: Loop, pf: Any, port: int) -> None:
        super().__init__(loop)
        self.pf, self.port = pf, port
        self.sock: socket.socket = pf.socket(port)
        threading.Thread(target=self._pump, daemon=True, name="gpupool-kube-forward").start()

    def _pump(self) -> None:
        while True:
            try:
                data = self.sock.recv(CHUNK)
            except OSError:
                data = b""
            if not data:
                break
            self.emit(STDOUT, data)
        error = None
        with contextlib.suppress(Exception):
            error = self.pf.error(self.port)
        if error:
            self.emit(STDERR, f"{error}\n".encode())
        self.exit(1 if error else 0)

    def write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(Exception):
            self.pf.close()
