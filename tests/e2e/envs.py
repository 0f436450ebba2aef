"""Environments of their own for tools whose dependencies clash with the server's (MLflow, ZenML) and for gpupool
installed as a user installs it: inside the test environment, so a workload's sandbox (which sees that
environment, read-only) can run them. Built once per machine and reused."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import free_port, wait_for

REPO = Path(__file__).resolve().parents[2]
OPT = Path(sys.prefix) / "opt"
UV = Path(sys.executable).parent / "uv"


def environment(name: str, *requirements: str, checkout: str | None = None, fresh: bool = False) -> Path:
    """`OPT/name` with `requirements` in it and, where `checkout` is given, this checkout built and installed
    with those extras ("" for none) afresh; its Python. One build at a time: test workers building the checkout
    at once would share its build directories. `fresh` makes the environment anew (an install that must hold
    exactly what the checkout's extras bring, nothing left from an earlier one)."""
    env = OPT / name
    python = env / "bin" / "python"
    OPT.mkdir(parents=True, exist_ok=True)
    with open(OPT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if fresh:
            shutil.rmtree(env, ignore_errors=True)
        if not (env / ".ready").exists():
            shutil.rmtree(env, ignore_errors=True)
            subprocess.run([str(UV), "venv", "-q", "--python", sys.executable, str(env)], check=True)
            if requirements:
                subprocess.run([str(UV), "pip", "install", "-q", "--python", str(python), *requirements], check=True)
            (env / ".ready").touch()
        if checkout is not None:
            spec = f"{REPO}[{checkout}]" if checkout else str(REPO)
            subprocess.run([str(UV), "pip", "install", "-q", "--python", str(python), "--reinstall-package", "gpupool",
                            spec], check=True)  # fmt: skip
    return python


@contextlib.contextmanager
def mlflow_server(root: Path) -> Iterator[str]:
    """A real MLflow tracking server (from PyPI, in its own environment) keeping its runs and artifacts in `root`;
    its address."""
    python = environment("mlflow", "mlflow>=3.1,<4")
    port = free_port()
    log = open(root / "server.log", "wb")  # noqa: SIM115 - the server keeps it for its whole life
    proc = subprocess.Popen(
        [str(python), "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
            try:
                return httpx.get(f"{url}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 120, "the MLflow server")
        # Its store is made (its tables migrated) on the first request that reads it, which can take longer than
        # gpupool's 5 s for a run on a loaded machine: made here, before any test asks for a run.
        httpx.get(f"{url}/api/2.0/mlflow/experiments/search", params={"max_results": 1}, timeout=120).raise_for_status()
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the server and the uvicorn it starts
        proc.wait(30)


@pytest.fixture(scope="module")
def mlflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real MLflow tracking server for the module's tests: import it into the test module."""
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as url:
        yield url
