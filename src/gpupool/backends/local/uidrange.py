"""A range of uids no other gpupool server on this host gives out.

A project's identity is `uid_base + project id` (sandbox.py). Two servers on one host with different stores (and
so different projects) but overlapping ranges would give two projects the same uid: one tenant could then signal,
trace and read the other's processes and files. So each root server claims its range in a host-wide registry
before it runs anything, and refuses to start where another server's range overlaps.

The registry is a directory of root's (REGISTRY), a file per data directory: replicas of one installation share
their data directory, and so their entry. An entry counts while its server holds a shared lock on it, or while any
process runs under a uid of its range (a stopped server's members run on until it is back); otherwise it is
stale, and removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import stat
from pathlib import Path

SPAN = 100_000
"""uids per server: projects (and departments, whose ids they share) up to this id."""
REGISTRY = Path("/var/lib/gpupool/uid-ranges")
SUBORDINATE = (Path("/etc/subuid"), Path("/etc/subgid"))
"""The host's subordinate ids (rootless podman's, a user namespace's): a user who holds one acts as that uid."""


class RangeTaken(Exception):
    """Another server on this host gives out uids of this range; the message says which and what to do."""


def claim(
    data_dir: Path, base: int, registry: Path = REGISTRY, subordinate: tuple[Path, ...] = SUBORDINATE
) -> int:
    """Claim [base, base + SPAN) for the server on `data_dir`; returns the descriptor whose lock holds the claim
    (kept open for the server's life). Raises RangeTaken."""
    for ids in subordinate:
        for user, start, count in _subordinate(ids):
            if start < base + SPAN and base < start + count:
                raise RangeTaken(
                    f"uids {base}-{base + SPAN - 1} overlap {user}'s subordinate ids in {ids} ({start}-"
                    f"{start + count - 1}): that user could act as a project. Give this server another --uid-base"
                )
    registry.mkdir(mode=0o700, parents=True, exist_ok=True)
    _trusted(registry)
    where = str(data_dir.resolve())
    me = hashlib.sha256(where.encode()).hexdigest()[:20]
    guard = os.open(registry / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)
        uids = None
        for entry in sorted(registry.glob("*.range")):
            if entry.stem == me:
                continue
            try:
                other_base, other_dir = _read(entry)
            except (OSError, ValueError):
                _drop(entry)
                continue
            if other_base + SPAN <= base or base + SPAN <= other_base:
                continue
            if uids is None:
                uids = _running_uids()
            if not _held(entry) and not any(other_base <= u < other_base + SPAN for u in uids):
                _drop(entry)  # its server is gone and nothing of its runs
                continue
            free = _free_base(registry, base, uids)
            raise RangeTaken(
                f"uids {base}-{base + SPAN - 1} overlap {other_base}-{other_base + SPAN - 1}, given out by the "
                f"gpupool server on {other_dir}: two servers with different projects would share identities. "
                f"Give this one a range of its own (--uid-base {free}), or use that server's data directory"
            )
        fd = os.open(registry / f"{me}.range", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        text = f"{base}\n{where}\n".encode()
        if os.pread(fd, 4096, 0) != text:
            os.ftruncate(fd, 0)
            os.pwrite(fd, text, 0)
        return fd
    finally:
        os.close(guard)


def _trusted(registry: Path) -> None:
    """Refuse a registry that anyone but root could change: each directory on its way root's and writable by no
    one else (a sticky one, as /tmp, excepted), and no link. Another account that could would unlink live entries
    (two servers sharing uids) or plant links for root to write through."""
    for d in (registry, *registry.parents):
        st = os.lstat(d)
        if stat.S_ISLNK(st.st_mode) or st.st_uid != 0 or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
            raise PermissionError(f"{d} is not root's alone (owner {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})")


def _subordinate(ids: Path) -> list[tuple[str, int, int]]:
    out = []
    with contextlib.suppress(OSError):
        for line in ids.read_text().splitlines():
            with contextlib.suppress(ValueError):
                user, start, count = line.strip().split(":")
                out.append((user, int(start), int(count)))
    return out


def _read(entry: Path) -> tuple[int, str]:
    base, where = entry.read_text().splitlines()[:2]
    return int(base), where


def _held(entry: Path) -> bool:
    """Whether a server holds the entry's lock (replicas hold it shared; nobody holds it exclusively)."""
    fd = os.open(entry, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _drop(entry: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        entry.unlink()


def _running_uids() -> set[int]:
    out: set[int] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("Uid:"):
                    out.add(int(line.split()[1]))
                    break
    return out


def _free_base(registry: Path, near: int, uids: set[int]) -> int:
    """A base no live entry's range overlaps, above `near`: what the refusal suggests."""
    taken = []
    for entry in registry.glob("*.range"):
        with contextlib.suppress(OSError, ValueError):
            other = _read(entry)[0]
            if _held(entry) or any(other <= u < other + SPAN for u in uids):
                taken.append(other)
    base = near
    while any(not (t + SPAN <= base or base + SPAN <= t) for t in taken):
        base += SPAN
    return base
