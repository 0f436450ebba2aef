"""Which gpupool roles an OpenID Connect provider's groups grant: `RoleMap`, parsed from `GROUP=...` strings."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

ROLES = ("viewer", "member", "admin")  # weakest first
_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")  # the API's DNS-safe department and project names


@dataclass(frozen=True, slots=True)
class Grant:
    """`kind` admin (the whole instance: `queue` is None and `role` is admin), department or project."""

    kind: Literal["admin", "department", "project"]
    queue: str | None
    role: str


_KIND_ORDER = {"admin": 0, "department": 1, "project": 2}


def parse_role_entry(entry: str) -> tuple[str, Grant]:
    """`GROUP=admin`, `GROUP=department:NAME:ROLE` or `GROUP=project:NAME:ROLE` (ROLE admin, member or viewer).
    The group is everything before the last '=', so LDAP-style names such as `cn=ml,ou=groups` work."""
    group, sep, target = entry.strip().rpartition("=")
    group, target = group.strip(), target.strip()
    if not sep or not group:
        raise ValueError(
            f"{entry[:200]!r}: a role mapping is GROUP=admin, GROUP=department:NAME:ROLE or GROUP=project:NAME:ROLE"
        )
    if target == "admin":
        return group, Grant("admin", None, "admin")
    parts = target.split(":")
    if len(parts) != 3 or parts[0] not in ("department", "project"):
        raise ValueError(
            f"{entry[:200]!r}: after '=' comes admin, department:NAME:ROLE or project:NAME:ROLE, not {target[:100]!r}"
        )
    kind, name, role = parts
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"{entry[:200]!r}: {name[:80]!r} is not a {kind} name (1-63 lowercase letters, digits "
            "and '-', starting and ending with a letter or digit)"
        )
    if role not in ROLES:
        raise ValueError(f"{entry[:200]!r}: the role {role[:40]!r} is not one of admin, member, viewer")
    return group, Grant("department" if kind == "department" else "project", name, role)


@dataclass(frozen=True, slots=True)
class RoleMap:
    """Which gpupool roles a provider's groups grant. Empty: nobody gets anything (default deny)."""

    entries: tuple[tuple[str, Grant], ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> RoleMap:
        return cls(tuple(parse_role_entry(e) for e in entries if e.strip()))

    def grants(self, groups: Iterable[str]) -> list[Grant]:
        """What these groups grant: one grant per (kind, queue), the strongest role where several groups give
        one, sorted admin first, then departments, then projects, each by name. Group names match exactly."""
        member = set(groups)
        best: dict[tuple[str, str | None], Grant] = {}
        for group, grant in self.entries:
            if group not in member:
                continue
            key = (grant.kind, grant.queue)
            held = best.get(key)
            if held is None or ROLES.index(grant.role) > ROLES.index(held.role):
                best[key] = grant
        return sorted(best.values(), key=lambda g: (_KIND_ORDER[g.kind], g.queue or "", g.role))
