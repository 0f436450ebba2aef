"""The server as a new user installs and starts it: `pip install 'gpupool[server]'` (the checkout built and installed
with that extra alone into a fresh environment) serving a job submitted with the base package's CLI; `./scripts/start`
in a fresh copy of the tree and a clean home reaching a healthy API; and no module the server loads importing a
package that its extra does not install (a suite that installs every extra cannot see a missing one otherwise)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests import uids
from tests.e2e.conftest import GPUPOOL, free_port, wait_for
from tests.e2e.envs import environment

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[2]


def _healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"the server exited with {proc.returncode}:\n{log.read_text(errors='replace')[-4000:]}")
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def _serving(cmd: list[str], log: Path, env: dict[str, str], cwd: Path, port: int, wait_s: float) -> Iterator[str]:
    """`cmd` started in a session of its own, logging to `log`, until its /healthz answers; its URL."""
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
    try:
        wait_for(lambda: _healthy(url, proc, log), wait_s, f"{url}/healthz (log: {log})")
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _clean_env(home: Path) -> dict[str, str]:
    """The environment of a new user: no gpupool settings, nothing of the test's venv on PATH, a home of its own."""
    venv_bin = str(Path(sys.executable).parent)
    path = ":".join(p for p in os.environ.get("PATH", "").split(":") if p and p != venv_bin)
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "XDG_", "VIRTUAL_ENV"))}
    # A root server claims a uid range of its own on this host: one the test run's other servers do not use.
    return keep | {"HOME": str(home), "PATH": path, "GPUPOOL_UID_BASE": str(uids.next_base())}


def _caches() -> dict[str, str]:
    """The download caches stay the machine's: a new user's first start downloads the same packages, only slower."""
    real = Path.home()
    return {
        "UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR", str(real / ".cache" / "uv")),
        "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR", str(real / ".cache" / "pip")),
        "NPM_CONFIG_CACHE": os.environ.get("NPM_CONFIG_CACHE", str(real / ".npm")),
    }


def _stop_workloads(data_dir: Path) -> None:
    for rec in (data_dir / "run").glob("*.json") if (data_dir / "run").is_dir() else ():
        with contextlib.suppress(OSError, ValueError, KeyError):
            os.killpg(int(json.loads(rec.read_text())["pid"]), signal.SIGKILL)


def test_the_server_extra_alone_serves_a_job_the_base_cli_submits(tmp_path: Path) -> None:
    server = environment("server-only", checkout="server", fresh=True).parent
    cli = environment("base-only", checkout="", fresh=True).parent / "gpupool"
    probe = "import importlib.util as u; print([m for m in ('psycopg', 'kubernetes', 'jupyterlab') if u.find_spec(m)])"
    found = subprocess.run([str(server / "python"), "-c", probe], capture_output=True, text=True, check=True)
    assert found.stdout == "[]\n", "the server's environment holds another extra's packages"
    home = tmp_path / "home"
    home.mkdir()
    env = _clean_env(home)
    data = tmp_path / "data"
    port = free_port()
    cmd = [str(server / "gpupool"), "server", "--data-dir", str(data), "--port", str(port), "--interval", "0.5"]
    try:
        with _serving(cmd, tmp_path / "server.log", env, tmp_path, port, 120) as url:
            user = env | {"GPUPOOL_URL": url, "GPUPOOL_TOKEN": (data / "admin-token").read_text().strip()}

            def run(*args: str) -> str:
                done = subprocess.run([str(cli), *args], env=user, cwd=tmp_path, capture_output=True, text=True,
                                      timeout=60)  # fmt: skip
                assert done.returncode == 0, f"gpupool {' '.join(args)}: {done.stderr}{done.stdout}"
                return done.stdout

            run("department", "create", "research", "--deserved-gpus", "2")
            run("project", "create", "vision", "--department", "research", "--deserved-gpus", "2")
            run("submit", "-p", "vision", "--name", "hello", "--gpus", "1", "--no-code", "--",
                "sh", "-c", "echo hello on GPU $CUDA_VISIBLE_DEVICES")  # fmt: skip
            wait_for(lambda: json.loads(run("describe", "hello", "-o", "json"))["state"] == "succeeded", 60, "hello")
            assert run("logs", "hello") == "hello on GPU 0\n"
    finally:
        _stop_workloads(data)


def _closure(requirements: list[str], extras: frozenset[str] = frozenset()) -> set[str]:
    """The distributions `requirements` install, transitively, as they are installed here."""
    seen: set[str] = set()
    todo = [(Requirement(r), extras) for r in requirements]
    while todo:
        req, parent_extras = todo.pop()
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in parent_extras or {""}):
            continue
        name = canonicalize_name(req.name)
        key = f"{name}[{','.join(sorted(req.extras))}]"
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a requirement for another platform or Python, not installed here
        todo += [(Requirement(r), frozenset(req.extras)) for r in dist.requires or []]
    return {k.partition("[")[0] for k in seen}


SERVER_RUN = """
import sys
sys.argv = ["gpupool", *sys.argv[1:]]
from gpupool.cli.main import main
main()
"""


def test_no_module_the_server_loads_needs_another_extra(tmp_path: Path) -> None:
    """A server on SQLite (the embedded default) started, serving a job, and stopped, under `-X importtime`: every
    module it imported, at start or later, is the standard library's, gpupool's, or from a distribution that
    `gpupool[server]` installs."""
    project = metadata.metadata("gpupool")
    base = [r for r in project.get_all("Requires-Dist") or [] if "extra ==" not in r]
    server = [r.split(";")[0] for r in project.get_all("Requires-Dist") or [] if re.search(r"extra == .server.", r)]
    allowed = _closure(base + server)
    owners = metadata.packages_distributions()
    data = tmp_path / "data"
    port = free_port()
    log = tmp_path / "server.log"
    cmd = [sys.executable, "-X", "importtime", "-c", SERVER_RUN, "server", "--data-dir", str(data), "--port",
           str(port), "--interval", "0.5", "--gpus", "fake:2xH100-80GB"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["GPUPOOL_UID_BASE"] = str(uids.next_base())  # a root server's range of its own on this host
    try:
        with _serving(cmd, log, env, tmp_path, port, 120) as url:
            user = env | {"GPUPOOL_URL": url, "GPUPOOL_TOKEN": (data / "admin-token").read_text().strip()}
            for args in (["department", "create", "d", "--deserved-gpus", "1"],
                         ["project", "create", "p", "--department", "d", "--deserved-gpus", "1"],
                         ["submit", "-p", "p", "--name", "j", "--no-code", "--", "true"]):  # fmt: skip
                subprocess.run([GPUPOOL, *args], env=user, cwd=tmp_path, check=True, capture_output=True, timeout=60)

            def state() -> str:
                done = subprocess.run([GPUPOOL, "describe", "j", "-o", "json"], env=user, cwd=tmp_path, check=True,
                                      capture_output=True, text=True, timeout=60)  # fmt: skip
                return str(json.loads(done.stdout)["state"])

            wait_for(lambda: state() == "succeeded", 60, "j to succeed")
    finally:
        _stop_workloads(data)
    imported = {m.group(1).strip().split(".")[0] for m in re.finditer(r"^import time:[^|]*\|[^|]*\|\s*(\S+)",
                log.read_text(), re.MULTILINE)}  # fmt: skip
    assert "gpupool" in imported and "uvicorn" in imported, "the import trace was not read"
    # The trace lists tried imports too: a module not installed here was an optional import that failed and was
    # handled (the server ran). The interpreter's own start-up (site's .pth hooks) is not the server's.
    tried = imported - set(sys.stdlib_module_names) - {"gpupool", "_distutils_hack", "sitecustomize", "usercustomize"}
    foreign = {
        top: sorted(owners.get(top, ["?"]))
        for top in sorted(tried)
        if not top.startswith("_sysconfigdata")  # the interpreter's build settings, read by sysconfig
        and (top in owners or importlib.util.find_spec(top) is not None)
        and not any(canonicalize_name(d) in allowed for d in owners.get(top, []))
    }
    assert foreign == {}, f"modules of distributions gpupool[server] does not install: {foreign}"


def _tree_copy(dest: Path) -> None:
    """What a fresh clone of this working tree holds: the tracked files and the untracked ones git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


@pytest.mark.timeout(900)
def test_scripts_start_in_a_fresh_clone_and_a_clean_home_reaches_a_healthy_api(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    _tree_copy(clone)
    home = tmp_path / "home"
    home.mkdir()
    env = _clean_env(home)
    env |= _caches()
    port = free_port()
    log = tmp_path / "start.log"
    try:
        with _serving([str(clone / "scripts" / "start"), "--port", str(port)], log, env, clone, port, 800) as url:
            health = httpx.get(f"{url}/healthz", timeout=5).json()
            assert health["status"] == "ok"
            workloads = httpx.get(f"{url}/api/v1/workloads", timeout=5)
            assert workloads.status_code == 401  # the API, not merely a port: it asks who is calling
    finally:
        _stop_workloads(home / ".local" / "share" / "gpupool")
    said = log.read_text()
    lines = [line for line in said.splitlines() if line.startswith(("bootstrap:", "scripts/start:"))]
    assert lines[:3] == [
        f"bootstrap: creating .venv with Python {sys.version.split()[0]}",
        "bootstrap: installing uv into .venv (pip)",
        "bootstrap: installing gpupool[server,apps,sim] and its dependencies into .venv (uv; the first time "
        "downloads them)",
    ], said
    assert lines[3:] == [
        "bootstrap: checking that the server imports",
        "bootstrap: gpupool[server,apps,sim] installed",
        "scripts/start: starting gpupool server (Ctrl-C stops it)",
    ], said
    assert "gpupool: 2 GPUs (simulated: 2× H100), store sqlite:///~/.local/share/gpupool/gpupool.db" in said.replace(
        str(home), "~"
    )
    assert list((clone / ".venv").glob(".installed-*")) != []


def test_bootstrap_marks_nothing_installed_when_the_server_does_not_import(tmp_path: Path) -> None:
    """An install whose server cannot start (here a module importing a package no extra installs) fails at the
    install, says why, and leaves no stamp: the next run installs and checks again rather than skipping to the
    same failure."""
    clone = tmp_path / "clone"
    _tree_copy(clone)
    leases = clone / "src" / "gpupool" / "store" / "leases.py"
    leases.write_text(leases.read_text() + "\nimport gpupool_no_such_dependency  # noqa: E402\n")
    home = tmp_path / "home"
    home.mkdir()
    env = _clean_env(home) | _caches()
    for _ in range(2):
        done = subprocess.run([str(clone / "scripts" / "bootstrap"), "server"], env=env, cwd=clone,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 1, done.stdout + done.stderr
        assert "bootstrap: installing gpupool[server] and its dependencies into .venv" in done.stdout
        assert done.stdout.rstrip().endswith("bootstrap: checking that the server imports")
        assert "ModuleNotFoundError: No module named 'gpupool_no_such_dependency'" in done.stderr
        assert list((clone / ".venv").glob(".installed-*")) == []
