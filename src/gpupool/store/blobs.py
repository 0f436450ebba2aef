"""The content-addressed blob area under the data dir: workloads' code, as chunks named by their SHA-256.

A blob is written to a temporary file, synced, and renamed into place (then its directory synced), so a crash
leaves either the whole blob or nothing under its name; writing one that exists already is a no-op. Which
project may use a blob, and which workloads keep one alive, is the store's business (CodeBlobRow and
CodeManifestRow in tables.py), not this directory's.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

from gpupool.durable import fsync_dir

DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")
CHUNK_BYTES = 1024 * 1024
"""The largest blob: files are cut into chunks of this size, so every upload fits the API's body limit and a
changed part of a large file is all a resubmit sends."""


def hex_of(digest: str) -> str:
    """The hex part of `sha256:<hex>`; ValueError for anything else."""
    m = DIGEST.fullmatch(digest)
    if m is None:
        raise ValueError(f"{digest[:80]!r} is not a digest (sha256:<64 hex digits>)")
    return m.group(1)


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class BlobStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._tmp = root / "tmp"
        self._tmp.mkdir(parents=True, exist_ok=True)

    def path(self, digest: str) -> Path:
        h = hex_of(digest)
        return self.root / h[:2] / h

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def read(self, digest: str) -> bytes:
        return self.path(digest).read_bytes()

    def put(self, digest: str, data: bytes) -> bool:
        """Store `data` under `digest` (ValueError if it is not that data's). True if it was new."""
        if digest_of(data) != digest:
            raise ValueError(f"the body's SHA-256 is not {digest}")
        final = self.path(digest)
        if final.is_file():
            return False
        final.parent.mkdir(exist_ok=True)
        tmp = self._tmp / f"{final.name}.{os.getpid()}.{time.monotonic_ns()}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o444)
            tmp.replace(final)  # two writers of one blob both write the same bytes: the last rename wins, harmlessly
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        fsync_dir(final.parent)
        return True

    def remove(self, digest: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(digest).unlink()

    def stored(self) -> Iterator[tuple[str, float]]:
        """Every blob held, with when it was written."""
        for sub in self.root.iterdir():
            if len(sub.name) != 2 or not sub.is_dir():
                continue
            for f in sub.iterdir():
                with contextlib.suppress(FileNotFoundError):
                    yield f"sha256:{f.name}", f.stat().st_mtime

    def sweep_tmp(self, older_than_s: float) -> None:
        """Temporary files a crash left behind."""
        cutoff = time.time() - older_than_s
        for f in self._tmp.iterdir():
            with contextlib.suppress(FileNotFoundError):
                if f.stat().st_mtime < cutoff:
                    f.unlink()


def blob_root(data_dir: Path) -> Path:
    """Where a server keeps its blobs: the API writes them, the local backend copies workloads' code from them."""
    return data_dir / "code" / "blobs"
