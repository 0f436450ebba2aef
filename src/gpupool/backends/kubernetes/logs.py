"""A member's log followed as it is written: one streaming request to the kubelet (through the API server),
not the whole log again on every poll."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

CHUNK = 64 * 1024


def follow(
    open_stream: Callable[[], Any], offset: int, ended: Callable[[], bool], poll_s: float = 1.0
) -> Iterator[bytes]:
    """Bytes from `offset` on, as they come, until the stream ends or the member has ended and nothing more came
    within `poll_s` (a kubelet ends the stream itself when the container exits; not every one does).

    The kubelet knows no byte offsets, so the stream starts at the log's beginning and the first `offset` bytes
    are passed over: exact, and paid once per call. A stream broken while the member runs is opened again the
    same way, from where it broke. `open_stream` returns an unread streaming HTTP response (urllib3)."""
    position = 0
    while True:
        try:
            response = open_stream()
        except Exception:  # no such container (yet, or any more): nothing to follow
            return
        chunks: queue.Queue[bytes | None] = queue.Queue()
        threading.Thread(target=_pump, args=(response, chunks), name="gpupool-log-follow", daemon=True).start()
        seen = 0
        try:
            quiet_since_end = False
            while True:
                try:
                    chunk = chunks.get(timeout=poll_s)
                except queue.Empty:
                    if quiet_since_end:
                        return
                    quiet_since_end = ended()
                    continue
                if chunk is None:
                    break
                quiet_since_end = False
                start = max(0, max(offset, position) - seen)
                seen += len(chunk)
                if start < len(chunk):
                    position = seen
                    yield chunk[start:]
        finally:
            _close(response)
        if ended():
            return
        time.sleep(poll_s)  # the kubelet ended the stream before gpupool saw the member end: look again shortly


def _pump(response: Any, chunks: queue.Queue[bytes | None]) -> None:
    """Reads in its own thread, so the follower can look up from a quiet stream to see whether to stop."""
    try:
        for chunk in response.stream(CHUNK, decode_content=False):
            if chunk:
                chunks.put(bytes(chunk))
    except Exception:  # broken, or closed by the follower: either way the stream is over
        pass
    chunks.put(None)


def _close(response: Any) -> None:
    with contextlib.suppress(Exception):
        response.shutdown()  # unblocks the pump's read
    with contextlib.suppress(Exception):
        response.release_conn()
