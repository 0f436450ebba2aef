"""The core imports nothing outside itself, the standard library and numpy."""

import ast
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "src" / "gpupool" / "core"
ALLOWED = set(sys.stdlib_module_names) | {"numpy", "gpupool"}


def test_core_imports_only_itself_the_standard_library_and_numpy() -> None:
    offenders = []
    for path in sorted(CORE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in ALLOWED or (top == "gpupool" and not name.startswith("gpupool.core")):
                    offenders.append(f"{path.relative_to(CORE)}: {name}")
    assert offenders == []
    assert len(list(CORE.rglob("*.py"))) > 10
