"""uid ranges for the servers tests start: root servers on one host must not share one (uidrange.py), and a test
run starts many at once (on each xdist worker, several per test). Each worker has a thousand ranges of its own,
handed out in turn; the last is its default, which servers started without `--uid-base` get from the environment
(GPUPOOL_UID_BASE, set for the whole session by tests/conftest.py)."""

from __future__ import annotations

import itertools
import os

from gpupool.backends.local.uidrange import SPAN

_FIRST = 100_000_000
_PER_WORKER = 1000
_turn = itertools.count()
_by_root: dict[str, int] = {}


def _worker() -> int:
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name[2:]) if name[2:].isdigit() else 0


def next_base(root: object = None) -> int:
    """A base for one more server of this worker's; the same again for a server started anew on `root` (its
    projects' files and members keep their uids)."""
    if root is not None and str(root) in _by_root:
        return _by_root[str(root)]
    slot = _worker() * _PER_WORKER + next(_turn) % (_PER_WORKER - 1)
    base = _FIRST + slot * SPAN
    if root is not None:
        _by_root[str(root)] = base
    return base


def default_base() -> int:
    return _FIRST + (_worker() * _PER_WORKER + _PER_WORKER - 1) * SPAN
