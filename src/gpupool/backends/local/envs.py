"""A workload's own Python environment, built with uv and never the server's.

A member without an image runs in a virtual environment of its own: built from the `requirements.txt` and
`pyproject.toml` (its dependencies) in its working directory, or empty where it has neither, plus JupyterLab for a
notebook. Environments are cached under `<data>/envs/<hash>`, keyed by those files, the base interpreter and what
a notebook adds, and built once: the first member to need one builds it under a lock, the others wait and reuse
it. Nothing a job or a notebook installs can reach the server's own virtualenv, which is never on its PATH.

Environments are per project (`<data>/envs/<project id>/<hash>`, uv's cache beside them), and built by the
project's own identity in a sandbox like its members' (a build runs the packages' own code: an sdist's setup.py),
with the environment writable there and read-only to the members that use it. So a project can neither read nor
poison another's packages.

The build runs in the member's launch, after its wrapper has marked it started (runs.py), so a slow download never
holds the scheduling loop, and uv's output lands in the member's log. This file runs as a script there
(`python -I envs.py ...`, standard library only); a failed build ends the member with BUILD_FAILED, and uv's last
lines are in its log and in its run dir's reason file.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

BUILD_FAILED = 97
"""The exit status of a member whose environment could not be built (it never ran)."""
INSIDE = "/run/gpupool-env"
"""Where a sandboxed member sees its environment (read-only); the environment is relocatable."""
CACHE_INSIDE = "/run/gpupool-uv-cache"
"""Where a sandboxed build sees its project's uv cache (under /run: the parents bubblewrap makes elsewhere are
closed to the project's identity)."""
READY = ".gpupool-ready"
SOURCES = ("requirements.txt", "pyproject.toml")
SCHEMA = "1"
"""Part of every hash: bump it when how an environment is built changes."""
_PASSED = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR")
_TAIL_LINES = 12


@dataclass(frozen=True, slots=True)
class Plan:
    """The environment a member runs in: where it is and what goes into it."""

    path: Path
    python: str
    """The base interpreter it is made from."""
    sources: tuple[str, ...]
    """Files of the working directory whose requirements it installs."""
    extras: tuple[str, ...]
    """Requirements it adds (JupyterLab for a notebook)."""


SHARED = "shared"
"""The directory (under the envs root) of the empty environment, which every project may share: it holds nothing
a tenant chose, and is made by the server at its start, so that work with no requirements starts without a build
(even on a full disk)."""


def plan(root: Path, workdir: Path, notebook: bool, python: str | None = None) -> Plan:
    """The environment for a member working in `workdir`: keyed by what it installs and on what Python. `root` is
    its project's directory; one with nothing to install gets the shared empty environment beside it."""
    base = python or str(getattr(sys, "_base_executable", sys.executable))
    sources = tuple(name for name in SOURCES if (workdir / name).is_file())
    extras = (_jupyterlab(),) if notebook else ()
    if not sources and not extras:
        root = root.parent / SHARED
    digest = hashlib.sha256()
    for part in (SCHEMA, base, sys.version, *extras):
        digest.update(part.encode() + b"\0")
    for name in sources:
        digest.update(name.encode() + b"\0" + (workdir / name).read_bytes() + b"\0")
    return Plan(root / digest.hexdigest()[:32], base, sources, extras)


def configure(root: Path, environ: dict[str, str]) -> None:
    """Note, for builds run in members' launches (whose environment is the member's, not the server's), which uv
    to run and what of the server's environment reaches it: proxies, certificates and uv's own settings. Kept
    readable by the server alone, since a proxy's address may carry a password."""
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)  # the environments in it are for the members to read (a sandbox binds its own alone)
    # Not UV_CACHE_DIR: each project's cache is its own (a shared one would let one project poison another's).
    passed = {k: v for k, v in environ.items() if (k.startswith("UV_") or k.upper() in _PASSED) and k != "UV_CACHE_DIR"}
    # Copies: the cache and the environment are separate mounts in a build's sandbox, which no hard link crosses.
    passed |= {"UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1", "UV_LINK_MODE": "copy"}
    text = json.dumps({"uv": find_uv(), "env": passed})
    path = root / "uv.json"
    tmp = path.with_name(f"uv.json.{os.getpid()}.tmp")
    # A restart with the disk full keeps what it had: what it noted last time, and the shared environment.
    with contextlib.suppress(OSError):
        if not path.exists() or path.read_text() != text:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            tmp.replace(path)
    shared = plan(root / SHARED, Path("/nonexistent"), False)
    with contextlib.suppress(BuildError, OSError):  # no uv, no room: each member says so when it starts
        shared.path.parent.mkdir(mode=0o755, exist_ok=True)
        build(Build(shared.path, shared.python, [], [], [], None, None), echo=False)


def find_uv() -> str | None:
    """uv on the server's PATH, else beside its interpreter (scripts/bootstrap installs it into the venv)."""
    found = shutil.which("uv")
    if found is not None:
        return found
    beside = Path(sys.executable).parent / "uv"
    return str(beside) if beside.exists() else None


def builder_argv(
    p: Plan,
    reason_file: Path,
    server_prefix: str,
    inside: str | None,
    box: list[str],
    owner: int | None,
    init: tuple[str, ...] = (),
) -> list[str]:
    """The command that builds (or finds) the environment, puts it first on PATH, runs `init` (in the build's
    box) and then the rest of its words. `box` runs the build sandboxed (its environment seen at `inside`,
    writable) as `owner`; empty: as it is."""
    argv = [sys.executable, "-I", __file__, "--env", str(p.path), "--python", p.python, "--reason", str(reason_file)]
    argv += ["--strip", server_prefix, "--box", json.dumps(box), "--init", json.dumps(list(init))]
    if owner is not None:
        argv += ["--owner", str(owner)]
    for source in p.sources:
        argv += ["--requirements", source]
    for extra in p.extras:
        argv += ["--with", extra]
    if inside is not None:
        argv += ["--inside", inside]
    return [*argv, "--"]


def _jupyterlab() -> str:
    """JupyterLab at the server's own version where it has one (so a warm uv cache has it), else the newest."""
    from importlib import metadata

    try:
        return f"jupyterlab=={metadata.version('jupyterlab')}"
    except metadata.PackageNotFoundError:
        return "jupyterlab"


# -- the build, run in a member's launch -------------------------------------------------------------------------
class BuildError(Exception):
    """The environment could not be built; the message is what the member's describe and log say."""


@dataclass(frozen=True, slots=True)
class Build:
    env: Path
    python: str
    sources: list[str]
    extras: list[str]
    box: list[str]
    """The sandbox the build runs in (empty: none), where the environment is at `inside`."""
    inside: str | None
    owner: int | None


def build(b: Build, echo: bool = True) -> None:
    """Build the environment once: under its lock, and only where no complete one is there yet. `echo`: uv's
    output goes to stdout (a member's log); the server's own start keeps it off its terminal."""
    env, root = b.env, b.env.parent
    settings = json.loads((root.parent / "uv.json").read_text())
    uv = settings.get("uv")
    if not uv:
        raise BuildError("uv is not installed on the server (scripts/bootstrap installs it: pip install uv)")
    cache = root / ".uv-cache"
    with open(root / f"{env.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (env / READY).exists():
            return
        shutil.rmtree(env, ignore_errors=True)  # what a build that died left half made
        for d in (env, cache):
            d.mkdir(exist_ok=True)
            if b.owner is not None:
                os.chown(d, b.owner, b.owner)
        at = b.inside or str(env)
        cache_at = CACHE_INSIDE if b.box else str(cache)
        uv_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": cache_at, "UV_CACHE_DIR": cache_at}
        uv_env |= settings["env"]
        steps = [[*b.box, uv, "venv", "--quiet", "--allow-existing", "--relocatable", "--python", b.python, at]]
        if b.sources or b.extras:
            reqs = [x for s in b.sources for x in ("-r", s)]
            steps.append([*b.box, uv, "pip", "install", "--python", f"{at}/bin/python", *reqs, *b.extras])
        for step in steps:
            done = subprocess.run(step, env=uv_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
            text = done.stdout.decode(errors="replace")
            if echo:
                sys.stdout.write(text)
            if done.returncode != 0:
                tail = "\n".join(text.strip().splitlines()[-_TAIL_LINES:])
                what = " and ".join(b.sources) if b.sources else "nothing (an empty environment)"
                raise BuildError(f"its Python environment could not be built from {what} (uv: {tail})")
        (env / READY).touch()


def _path(env_bin: str, path: str, strip: str) -> str:
    """The member's PATH: its environment first, and nothing of the server's virtualenv."""
    keep = [p for p in path.split(":") if p and not (strip and (p == strip or p.startswith(strip.rstrip("/") + "/")))]
    return ":".join([env_bin, *keep])


def main(args: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gpupool-env")
    parser.add_argument("--env", required=True, type=Path)
    parser.add_argument("--python", required=True)
    parser.add_argument("--reason", required=True, type=Path)
    parser.add_argument("--strip", default="")
    parser.add_argument("--requirements", action="append", default=[])
    parser.add_argument("--with", dest="extras", action="append", default=[])
    parser.add_argument("--inside", default=None)
    parser.add_argument("--box", default="[]")
    parser.add_argument("--owner", type=int, default=None)
    parser.add_argument("--init", default="[]")
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    ns = parser.parse_args(args)
    os.umask(0o022)
    try:
        build(Build(ns.env, ns.python, ns.requirements, ns.extras, json.loads(ns.box), ns.inside, ns.owner))
    except (BuildError, OSError, ValueError) as e:
        message = f"gpupool: {e}"
        print(message, flush=True)
        with contextlib.suppress(OSError):
            ns.reason.write_text(str(e))
        sys.exit(BUILD_FAILED)
    sys.stdout.flush()
    seen = ns.inside or str(ns.env)
    os.environ["VIRTUAL_ENV"] = seen
    os.environ["PATH"] = _path(f"{seen}/bin", os.environ.get("PATH", ""), ns.strip)
    os.environ.pop("PYTHONHOME", None)
    init = json.loads(ns.init)
    if init:  # in the build's sandbox, which has the network where the member's own may not
        code = subprocess.run([*json.loads(ns.box), *init], check=False).returncode
        if code != 0:
            message = f"its init command failed (exit status {code}): see its log"
            print(f"gpupool: {message}", flush=True)
            with contextlib.suppress(OSError):
                ns.reason.write_text(message)
            sys.exit(BUILD_FAILED)
    rest = ns.rest[1:] if ns.rest[:1] == ["--"] else ns.rest
    os.execvp(rest[0], rest)


if __name__ == "__main__":
    main(sys.argv[1:])
