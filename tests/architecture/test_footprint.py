"""What importing a part of gpupool loads, in a fresh interpreter: the client and `gpupool --help` none of the
server's or the simulator's libraries, the lifecycle's enums the standard library only, the core numpy besides."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
_CONTRACTS = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
# The libraries the base-distribution contract keeps from the client: the server's and the simulator's.
EXTRAS_ONLY = {
    name
    for contract in _CONTRACTS
    if contract["id"] == "base-distribution"
    for name in contract["forbidden_modules"]
    if not name.startswith("gpupool")
}

_PROBE = """
import contextlib, io, json, sys
before = set(sys.modules)
with contextlib.redirect_stdout(io.StringIO()):
{body}
loaded = {{name.partition(".")[0] for name in set(sys.modules) - before}}
print(json.dumps(sorted(loaded)))
"""


def _loaded(*lines: str) -> set[str]:
    """The top-level packages that running these lines loads, besides what the interpreter had at start."""
    body = "\n".join("    " + line for line in lines)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(body=body)], capture_output=True, text=True, timeout=120, check=True
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


def _third_party(names: set[str]) -> set[str]:
    return {n for n in names if n not in sys.stdlib_module_names and n != "gpupool"}


def test_the_extras_are_the_libraries_of_the_server_and_the_simulator() -> None:
    assert {"fastapi", "sqlalchemy", "matplotlib", "numpy", "pydantic_settings", "uvicorn"} <= EXTRAS_ONLY


def test_the_client_loads_none_of_the_extras_libraries() -> None:
    assert sorted(_loaded("import gpupool.client") & EXTRAS_ONLY) == []


def test_cli_help_loads_none_of_the_extras_libraries() -> None:
    loaded = _loaded(
        "from gpupool.cli.main import main",
        "sys.argv = ['gpupool', '--help']",
        "with contextlib.suppress(SystemExit):",
        "    main()",
    )
    assert sorted(loaded & EXTRAS_ONLY) == []
    assert "gpupool" in loaded  # the probe did run the CLI


def test_the_lifecycle_enums_load_the_standard_library_only() -> None:
    assert sorted(_third_party(_loaded("import gpupool.lifecycle.phases, gpupool.lifecycle.events"))) == []


def test_the_scheduling_core_loads_numpy_only_besides_the_standard_library() -> None:
    assert sorted(_third_party(_loaded("import gpupool.core"))) == ["numpy"]
