"""The import direction that keeps the shape: edges never reach past services and the client."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "gpupool"

# package -> gpupool packages it must not import
FORBIDDEN = {
    "sim": ("store", "backends", "control", "services", "api", "cli", "client", "server"),
    "store": ("backends", "control", "services", "api", "cli", "client", "server", "sim"),
    "backends": ("store", "control", "services", "api", "cli", "client", "server", "sim"),
    "client": ("store", "backends", "control", "services", "cli", "server", "sim"),
    # The CLI talks to the server only through the client (and reads the wire models it shares).
    "cli": ("store", "backends", "control", "services", "api.app", "api.deps", "api.routers"),
}


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return [n.removeprefix("gpupool.") for n in names if n.startswith("gpupool.")]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_layer_does_not_import_the_layers_above_it(package: str) -> None:
    offenders = []
    for path in sorted((SRC / package).rglob("*.py")):
        for name in _imports(path):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[package]):
                offenders.append(f"{path.relative_to(SRC)} imports gpupool.{name}")
    assert offenders == []
