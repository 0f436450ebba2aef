"""Caches a caller may keep from one cycle to the next (the simulator does): they hold only pure
functions of node state and request, so a decision is the same with or without them.
"""

from __future__ import annotations

from typing import Any


class Memo:
    def __init__(self) -> None:
        self.signatures: dict[tuple[object, ...], int] = {}
        """Node state -> a small integer, equal for nodes in equal states, stable while the memo lives."""
        self._tables: dict[tuple[object, ...], dict[Any, Any]] = {}

    def table(self, *key: object) -> dict[Any, Any]:
        """A cache dictionary for one purpose (a policy and its parameters)."""
        return self._tables.setdefault(key, {})
