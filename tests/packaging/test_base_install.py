"""`pip install gpupool`, no extras, for real: the wheel built from this tree, installed with its dependencies from
PyPI into a fresh venv. The CLI and the SDK work; the server's and the simulator's commands name their extra.

pip keeps its usual cache (PIP_CACHE_DIR, else ~/.cache/pip), so after the first run the build and the install come
from it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", *args], check=True)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding gpupool's wheel and its base dependencies only."""
    work = tmp_path_factory.mktemp("base-install")
    # The build runs in a copy, so it leaves no build/ or egg-info in the working tree.
    tree = work / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    _pip("wheel", "--no-deps", "--wheel-dir", str(work / "dist"), str(tree))
    (wheel,) = (work / "dist").glob("gpupool-*.whl")
    env = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    _pip("--python", str(env / "bin" / "python"), "install", str(wheel))
    return env


def _run(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], capture_output=True, text=True, timeout=120)


def _missing(extra: str) -> str:
    return "missing " + ", ".join(Requirement(r).name for r in PYPROJECT["project"]["optional-dependencies"][extra])


def _refusal(command: str, extra: str, why: str) -> str:
    return f"error: gpupool {command} needs gpupool's {extra} extra ({why}): pip install 'gpupool[{extra}]'\n"


def test_the_base_install_holds_none_of_the_extras(venv: Path) -> None:
    probe = "import importlib.util, json; print(json.dumps([m for m in %r if importlib.util.find_spec(m)]))"
    modules = ["fastapi", "sqlalchemy", "uvicorn", "numpy", "matplotlib", "pydantic_settings", "gpupool"]
    done = _run(venv, "python", "-c", probe % modules)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["gpupool"]


def test_cli_help_and_version(venv: Path) -> None:
    shown = _run(venv, "gpupool", "--help")
    assert (shown.returncode, shown.stderr) == (0, "")
    assert "Usage: gpupool [OPTIONS] COMMAND [ARGS]..." in shown.stdout
    assert "Start the gpupool server" in shown.stdout
    version = _run(venv, "gpupool", "version")
    assert (version.returncode, version.stdout, version.stderr) == (0, f"{VERSION}\n", "")


def test_the_client_imports(venv: Path) -> None:
    done = _run(venv, "python", "-c", "from gpupool.client import ApiError, Client; print(Client.__name__)")
    assert (done.returncode, done.stdout, done.stderr) == (0, "Client\n", "")


@pytest.mark.parametrize("args", [["server"], ["server", "--port", "8471"], ["server", "--help"]])
def test_the_server_names_its_extra(venv: Path, args: list[str]) -> None:
    done = _run(venv, "gpupool", *args)
    assert (done.returncode, done.stdout, done.stderr) == (1, "", _refusal("server", "server", _missing("server")))


def test_the_simulator_names_its_extra(venv: Path) -> None:
    done = _run(venv, "gpupool", "simulate", "org", "--trace", "t.csv", "--out", "o")
    assert (done.returncode, done.stdout, done.stderr) == (1, "", _refusal("simulate", "sim", _missing("sim")))


def test_policies_names_the_server_extra(venv: Path) -> None:
    done = _run(venv, "gpupool", "policies")
    expected = _refusal("policies", "server", "no module named 'numpy'")
    assert (done.returncode, done.stdout, done.stderr) == (1, "", expected)


@pytest.mark.parametrize("args", [["simulate", "--help"], ["simulate", "packing", "--help"]])
def test_the_simulators_help_reads_without_its_extra(venv: Path, args: list[str]) -> None:
    done = _run(venv, "gpupool", *args)
    assert done.returncode == 0, done.stderr
    note = "note: gpupool simulate needs gpupool's sim extra, not installed here: pip install 'gpupool[sim]'\n"
    assert done.stderr == note
    assert f"Usage: gpupool simulate {'packing ' if 'packing' in args else ''}[OPTIONS]" in done.stdout
    assert ("--pods" if "packing" in args else "Replay public GPU-cluster traces") in done.stdout
