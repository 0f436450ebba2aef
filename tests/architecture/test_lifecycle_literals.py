"""No phase or reason is spelled as a string outside the lifecycle package and the wire models: code compares and
sets them through the lifecycle's enums, so a new phase or reason has one home."""

from __future__ import annotations

import ast
from pathlib import Path

from gpupool.lifecycle.phases import AllocPhase, PendingReason, Phase, StopReason

SRC = Path(__file__).resolve().parents[2] / "src" / "gpupool"
WORDS = {m.value for e in (Phase, AllocPhase, StopReason, PendingReason) for m in e}
FIELDS = {"state", "stop_reason", "reason_code", "reason_event"}
HOME = ("lifecycle", "models")
"""The lifecycle defines them; the wire models declare what the API accepts and answers."""


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [s for elt in node.elts for s in _strings(elt)]
    return []


def _field(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _offences(path: Path) -> list[str]:
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        found: list[str] = []
        if isinstance(node, ast.Compare) and any(_field(x) in FIELDS for x in (node.left, *node.comparators)):
            found = [s for x in (node.left, *node.comparators) for s in _strings(x)]
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_field(t) in FIELDS for t in targets) and node.value is not None:
                found = _strings(node.value)
        elif isinstance(node, ast.Call):
            found = [s for k in node.keywords if k.arg in FIELDS for s in _strings(k.value)]
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in ("in_", "not_in") and _field(func.value) in FIELDS:
                found += [s for a in node.args for s in _strings(a)]
        out += [f"{path.relative_to(SRC)}:{getattr(node, 'lineno', 0)} {s!r}" for s in found if s in WORDS]
    return out


def test_phases_and_reasons_are_spelled_only_in_the_lifecycle() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        top = path.relative_to(SRC).parts[0]
        if top in HOME or top == "core" or "migrations" in path.parts:
            continue  # the core has its own enums (State, EvictReason, PendingCode); migrations are history
        offenders += _offences(path)
    assert offenders == []
