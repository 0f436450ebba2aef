"""Environments of their own for tools whose dependencies clash with the server's (MLflow, ZenML) and for gpupool
installed as a user installs it: inside the test environment, so a workload's sandbox (which sees that
environment, read-only) can run them. Built once per machine and reused."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OPT = Path(sys.prefix) / "opt"
UV = Path(sys.executable).parent / "uv"


def environment(name: str, *requirements: str, checkout: str | None = None) -> Path:
    """`OPT/name` with `requirements` in it and, where `checkout` is given, this checkout built and installed
    with those extras ("" for none) afresh; its Python. One build at a time: test workers building the checkout
    at once would share its build directories."""
    env = OPT / name
    python = env / "bin" / "python"
    OPT.mkdir(parents=True, exist_ok=True)
    with open(OPT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
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
