"""A running member's working directory on Kubernetes, for `gpupool cp`: tar through the API server's exec stream
into the pod's main container, as `kubectl cp` does.

The exec runs in the container's working directory (the code's /workspace where code was sent, the image's own
otherwise) as the container's own user, so `cp` reaches what the member itself can and nothing more: the pod is
the boundary, not path checks here. The image needs `sh` and `tar` (and `stat` for a listing, `head` for an
upload). An upload is checked here first (regular files and directories only, nothing climbing out) and sent with
its length, which the pod's `head -c` counts: the stream's stdin never has to be closed (v4 of the exec protocol
cannot). A pod that has ended has no container to exec into: its files went with it (409, saying so).

The API server reaches the container through its node's kubelet. Where that fails (no kubelet: the test cluster's
nodes are kwok's, which runs nothing), the cluster's own words come back as a 409, never a traceback.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Sequence
from typing import Any, Literal

from gpupool.backends.base import FileEntry, FilesError
from gpupool.backends.local.files import parts

CONTAINER = "main"
ERROR_CHANNEL = 3
_KINDS: dict[str, Literal["file", "dir", "link"]] = {
    "regular file": "file", "regular empty file": "file", "directory": "dir", "symbolic link": "link"
}  # fmt: skip
_LIST = 'cd -- "$1" && for f in * .[!.]* ..?*; do if [ -e "$f" ] || [ -L "$f" ]; then stat -c "%F|%s|%Y|%n" -- "$f"; fi; done'  # noqa: E501
_PUT = 'mkdir -p -- "$1" && head -c "$2" | tar -x -f - -C "$1" --no-same-owner'


class PodFiles:
    """The working directory of one running member's pod."""

    def __init__(self, core: Any, pod: str, namespace: str) -> None:
        self.core, self.pod, self.namespace = core, pod, namespace

    def list(self, rel: str) -> list[FileEntry]:
        names = parts(rel)
        where = "/".join(names) or "."
        out: list[FileEntry] = []
        raw = self._exec(["sh", "-c", _LIST, "gpupool-ls", where], b"", 16 * 2**20)
        for line in raw.decode(errors="replace").splitlines():
            kind, size, mtime, name = [*line.split("|", 3), "", "", ""][:4]
            if name and size.isdigit() and mtime.isdigit():
                path = "/".join([*names, name])
                out.append(FileEntry(path, _KINDS.get(kind, "other"), int(size), float(mtime)))
        return sorted(out, key=lambda e: e.path)

    def read(self, rel: str, max_bytes: int) -> tuple[bytes, bool]:
        names = parts(rel)
        if not names:
            return self._exec(["tar", "-c", "-f", "-", "."], b"", max_bytes), True
        data = self._exec(["tar", "-c", "-f", "-", "--", "/".join(names)], b"", max_bytes)
        return _unwrap(data, "/".join(names))

    def extract(self, rel: str, data: bytes, max_bytes: int) -> tuple[int, int]:
        files, size = _check(data, max_bytes)
        where = "/".join(parts(rel)) or "."
        self._exec(["sh", "-c", _PUT, "gpupool-cp", where, str(len(data))], data, 2**20)
        return files, size

    def _exec(self, argv: Sequence[str], stdin: bytes, max_bytes: int) -> bytes:
        from kubernetes.stream import stream

        try:
            ws = stream(
                self.core.connect_get_namespaced_pod_exec, self.pod, self.namespace, container=CONTAINER,
                command=list(argv), stdin=bool(stdin), stdout=True, stderr=True, tty=False, _preload_content=False,
                binary=True,
            )  # fmt: skip
        except Exception as e:  # the client raises ApiException, or the websocket library's own errors
            raise FilesError(f"the cluster refused to reach {self.pod}'s files: {said(e)}", 409) from None
        out, err = bytearray(), bytearray()
        try:
            for i in range(0, len(stdin), 1 << 20):
                ws.write_stdin(stdin[i : i + (1 << 20)])
            while ws.is_open():
                ws.update(timeout=1)
                out += ws.read_stdout() if ws.peek_stdout() else b""
                err += ws.read_stderr() if ws.peek_stderr() else b""
                if len(out) > max_bytes:
                    raise FilesError(f"more than {max_bytes} bytes: the most cp takes", 413)
            out += ws.read_stdout() if ws.peek_stdout() else b""  # what came with its end
            err += ws.read_stderr() if ws.peek_stderr() else b""
            status = ws.read_channel(ERROR_CHANNEL)
        except FilesError:
            raise
        except Exception as e:  # the stream broke (the cluster closed it while we wrote, say)
            broke = _failure(ws.read_channel(ERROR_CHANNEL)) or said(e)
            raise FilesError(f"cp in pod {self.pod} failed: {broke}", 409) from None
        finally:
            ws.close()
        failed = _failure(status)
        if failed is not None:
            what = bytes(err).decode(errors="replace").strip()[-500:] or failed
            raise FilesError(f"cp in pod {self.pod} failed: {what}", 404 if "No such file" in what else 409)
        return bytes(out)


def _failure(raw: bytes | str) -> str | None:
    """Why the exec failed, from its error channel (a metav1.Status), or None where it succeeded."""
    try:
        found = json.loads(raw or b"{}")
    except ValueError:
        return f"the cluster answered {str(raw)[:200]!r}"
    if not isinstance(found, dict) or not found or found.get("status") == "Success":
        return None
    return str(found.get("message") or found)[:500]


def said(exc: Exception) -> str:
    """What the API server said, out of the client's wrapping of it."""
    body = getattr(exc, "body", None)
    try:
        message = json.loads(body).get("message") if body else None
    except (ValueError, AttributeError):
        message = None
    return " ".join(str(message or getattr(exc, "reason", None) or exc).split())[:300]


def _unwrap(data: bytes, path: str) -> tuple[bytes, bool]:
    """A tar of `path` as `read` answers: a file's bytes, or a tar of a directory's contents (relative to it)."""
    try:
        src = tarfile.open(fileobj=io.BytesIO(data), mode="r:")  # noqa: SIM115 - closed below
    except tarfile.TarError as e:
        raise FilesError(f"the pod's tar could not be read: {e}", 409) from None
    with src:
        members = src.getmembers()
        if len(members) == 1 and members[0].isfile() and members[0].name.rstrip("/") == path:
            got = src.extractfile(members[0])
            return (got.read() if got is not None else b""), False
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:") as out:
            for m in members:
                name = m.name.rstrip("/")
                if name == path:
                    continue
                m.name = name[len(path) + 1 :] if name.startswith(path + "/") else name
                out.addfile(m, src.extractfile(m) if m.isfile() else None)
    return buf.getvalue(), True


def _check(data: bytes, max_bytes: int) -> tuple[int, int]:
    """An upload's (files, bytes), refused where it holds anything but regular files and directories inside."""
    files = total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for m in tar:
                parts(m.name)
                if not (m.isfile() or m.isdir()):
                    raise FilesError(f"{m.name!r}: only regular files and directories are copied in")
                if m.name.startswith("/"):
                    raise FilesError(f"{m.name!r} is not a relative path")
                files, total = files + m.isfile(), total + m.size
    except tarfile.TarError as e:
        raise FilesError(f"the body is not a tar: {e}") from None
    if total > max_bytes:
        raise FilesError(f"the upload is larger than {max_bytes} bytes, the most cp takes", 413)
    return files, total
