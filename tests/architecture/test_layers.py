"""The layer rules: pyproject.toml's [tool.importlinter] contracts, run by import-linter, one test per contract so
a broken one names itself and the import chain that breaks it; and no package of gpupool left outside them."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from importlinter import configuration
from importlinter.application.use_cases import lint_imports

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
SRC = ROOT / "src" / "gpupool"
CONTRACTS: list[dict[str, object]] = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]


@pytest.mark.parametrize("contract", [str(c["id"]) for c in CONTRACTS])
def test_the_contract_is_kept(contract: str, capsys: pytest.CaptureFixture[str]) -> None:
    configuration.configure()  # what import-linter's own command line does first: its readers and graph builder
    kept = lint_imports(str(PYPROJECT), limit_to_contracts=(contract,), cache_dir=None, no_logo=True)
    assert kept, capsys.readouterr().out


def _modules(package: Path, dotted: str) -> set[str]:
    children = {f"{dotted}.{p.stem}" for p in package.glob("*.py") if p.name != "__init__.py"}
    return children | {f"{dotted}.{p.parent.name}" for p in package.glob("*/__init__.py")}


def _layered() -> set[str]:
    names: set[str] = set()
    for contract in CONTRACTS:
        for layer in contract.get("layers", ()):  # type: ignore[attr-defined]
            for part in str(layer).replace(":", "|").split("|"):
                names.add(part.strip().strip("()"))
    return names


def test_every_package_has_a_layer() -> None:
    """gpupool.lifecycle is split (its enums are the edge's, its transitions the server's), so its modules are
    placed one by one; a new package or lifecycle module has to be placed before it can be imported anywhere."""
    modules = (_modules(SRC, "gpupool") - {"gpupool.lifecycle"}) | _modules(SRC / "lifecycle", "gpupool.lifecycle")
    assert sorted(modules - _layered()) == []
