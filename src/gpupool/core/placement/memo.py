"""Caches a caller may keep from one cycle to the next (the simulator and the control plane do): they hold
only pure functions of node state and request, so a decision is the same with or without them.
"""

from __future__ import annotations

from typing import Any

MAX_ENTRIES = 1_000_000
"""Cached entries kept across cycles before the memo starts afresh: a control plane runs for months, and
each new typical mix and each node state it meets would otherwise stay cached for good."""
MAX_TABLES = 64


class Memo:
    def __init__(self) -> None:
        self.signatures: dict[tuple[object, ...], int] = {}
        """Node state -> a small integer, equal for nodes in equal states, stable while the memo lives."""
        self._tables: dict[tuple[object, ...], dict[Any, Any]] = {}

    def table(self, *key: object) -> dict[Any, Any]:
        """A cache dictionary for one purpose (a policy and its parameters)."""
        return self._tables.setdefault(key, {})

    def bound(self) -> None:
        """Start afresh if the caches have grown past their limits. Called between cycles only: signatures
        must stay stable while a cycle's tables refer to them."""
        entries = len(self.signatures) + sum(len(t) for t in self._tables.values())
        if entries > MAX_ENTRIES or len(self._tables) > MAX_TABLES:
            self.signatures.clear()
            self._tables.clear()

    def size(self) -> tuple[int, int]:
        """(tables, entries), for tests and diagnostics."""
        return len(self._tables), len(self.signatures) + sum(len(t) for t in self._tables.values())
