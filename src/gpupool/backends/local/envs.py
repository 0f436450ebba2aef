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
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
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
_PASSED = frozenset({
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR",
    # uv's settings that say where and how to fetch, never who: its credentials (UV_INDEX_<NAME>_PASSWORD,
    # UV_PUBLISH_TOKEN, ...) are not among them.
    "UV_INDEX", "UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS", "UV_NO_INDEX",
    "UV_INDEX_STRATEGY", "UV_OFFLINE", "UV_NATIVE_TLS", "UV_INSECURE_HOST", "UV_HTTP_TIMEOUT", "UV_REQUEST_TIMEOUT",
    "UV_HTTP_RETRIES", "UV_CONCURRENT_DOWNLOADS", "UV_CONCURRENT_BUILDS", "UV_CONCURRENT_INSTALLS", "UV_PRERELEASE",
    "UV_RESOLUTION", "UV_EXCLUDE_NEWER", "UV_NO_BINARY", "UV_NO_BUILD", "UV_COMPILE_BYTECODE", "UV_TORCH_BACKEND",
})  # fmt: skip
"""What of the server's environment a project's build gets. The build runs the project's own code (an sdist's
setup.py), so whatever it is given, the tenant can read: nothing that names a credential."""
_TAIL_LINES = 12
ENV_FD_MIN = 10


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
    found = {name: _tenant_file(workdir / name) for name in SOURCES}
    sources = tuple(name for name in SOURCES if found[name] is not None)
    extras = (_jupyterlab(),) if notebook else ()
    if not sources and not extras:
        root = root.parent / SHARED
    digest = hashlib.sha256()
    for part in (SCHEMA, base, sys.version, *extras):
        digest.update(part.encode() + b"\0")
    for name in sources:
        digest.update(name.encode() + b"\0" + (found[name] or b"") + b"\0")
    return Plan(root / digest.hexdigest()[:32], base, sources, extras)


MAX_SOURCE_BYTES = 1 << 20
"""The most of a requirements file the server reads (as root, to key the environment): a larger one is refused."""


class SourceError(Exception):
    """A requirements file the server will not read: the message says why."""


def _tenant_file(path: Path) -> bytes | None:
    """A file of the member's working directory, read as the server may read a tenant's file: never through a link
    (its target could be anything root can open: /proc/kmsg blocks, /dev/zero never ends), never a FIFO or a
    device (opened without blocking, then refused), at most MAX_SOURCE_BYTES. None where there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise SourceError(f"{path.name} is a symbolic link: the environment is built from a plain file") from e
        raise SourceError(f"{path.name} cannot be read ({e.strerror})") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SourceError(f"{path.name} is not a plain file")
        if st.st_size > MAX_SOURCE_BYTES:
            raise SourceError(f"{path.name} is larger than {MAX_SOURCE_BYTES >> 20} MiB")
        return os.read(fd, MAX_SOURCE_BYTES + 1)[:MAX_SOURCE_BYTES]
    finally:
        os.close(fd)


def seal_env(env: dict[str, str], at: int | None = None) -> int:
    """A sealed, read-only memfd holding a member's environment (JSON), not inheritable (pass it with pass_fds);
    envfd.py says why. `at`: the descriptor number it must have (the builder replaces a member's memfd with an
    edited one under the same number, which the rest of its words name); else one at ENV_FD_MIN or above, clear
    of the descriptors the wrapper uses."""
    fd = os.memfd_create("gpupool-env", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(json.dumps(env).encode())
        while view:
            view = view[os.write(fd, view) :]
        seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        if at is not None:
            os.dup2(fd, at, inheritable=False)
            os.close(fd)
            return at
        if fd < ENV_FD_MIN:
            high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, ENV_FD_MIN)
            os.close(fd)
            return high
        return fd
    except BaseException:
        os.close(fd)
        raise


LOADER = (
    "import json, os, sys\n"
    "fd = int(sys.argv[1])\n"
    "size = os.fstat(fd).st_size\n"
    "env = json.loads(os.pread(fd, size, 0)) if size else {}\n"
    "os.close(fd)\n"
    "argv = sys.argv[2:]\n"
    "try:\n"
    "    os.execvpe(argv[0], argv, env)\n"
    "except OSError as e:\n"
    "    print(f'gpupool: {argv[0]}: {e.strerror}', file=sys.stderr, flush=True)\n"
    "    sys.exit(127 if isinstance(e, FileNotFoundError) else 126)\n"
)
"""Runs the rest of its words with the environment in its memfd (argv[1]), which it closes first: the last step
before a member's command, as the member's identity (envfd.py)."""


def loader_words(fd: int) -> list[str]:
    """This server's Python (which every sandbox shows its members) running LOADER, isolated and without site:
    no variable or file of the member's changes what it runs."""
    return [sys.executable, "-I", "-S", "-c", LOADER, str(fd)]


def read_env(fd: int) -> dict[str, str]:
    """The environment in a memfd made by seal_env, from its start (whoever read it before)."""
    size = os.fstat(fd).st_size
    value = json.loads(os.pread(fd, size, 0)) if size else {}
    if not isinstance(value, dict):
        raise ValueError("a member's environment is not a mapping")
    return {str(k): str(v) for k, v in value.items()}


def configure(root: Path, environ: dict[str, str]) -> None:
    """Note, for builds run in members' launches (whose environment is the member's, not the server's), which uv
    to run and what of the server's environment reaches it: proxies, certificates and uv's own settings. Kept
    readable by the server alone, since a proxy's address may carry a password."""
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)  # the environments in it are for the members to read (a sandbox binds its own alone)
    passed, withheld = build_environ(environ)
    if withheld:
        logging.getLogger("gpupool.envs").warning(
            "withheld from projects' environment builds, which run the project's code: %s", ", ".join(withheld)
        )
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
    with contextlib.suppress(BuildError, OSError):  # no uv, no room: each member says so when it starts
        ensure_shared(plan(root / SHARED, Path("/nonexistent"), False))


def ensure_shared(p: Plan) -> None:
    """The shared empty environment, made by the server alone: every project runs it, so one that a project's
    build had made (or written into) could run that project's code in everyone's work. One not the server's own
    is made anew. Raises BuildError or OSError where it cannot be made."""
    p.path.parent.mkdir(mode=0o755, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        if os.lstat(p.path).st_uid != os.geteuid() or os.lstat(p.path / READY).st_uid != os.geteuid():
            shutil.rmtree(p.path)
    build(Build(p.path, p.python, [], [], [], None, None), echo=False)


def build_environ(environ: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """What of `environ` a project's build gets, and the names withheld: any other uv setting (UV_CACHE_DIR too:
    each project's cache is its own, as a shared one would let one project poison another's), and a setting whose
    URL carries a user, a password or a query (a proxy's, a private index's)."""
    passed: dict[str, str] = {}
    withheld: list[str] = []
    for name, value in sorted(environ.items()):
        known = name.upper() in _PASSED
        if not known and not name.startswith("UV_"):
            continue
        if known and not _carries_credentials(value):
            passed[name] = value
        else:
            withheld.append(name)
    return passed, withheld


def _carries_credentials(value: str) -> bool:
    """A user or password (`user:pw@host`, with or without a scheme) or a query (`?token=`) anywhere in it. A token
    in a URL's path cannot be told from a path: docs/security.md says to keep credentials out of those."""
    return "@" in value or "?" in value


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
    env_fd: int,
    init: tuple[str, ...] = (),
) -> list[str]:
    """The command that builds (or finds) the environment, puts it first on PATH, runs `init` (in the build's
    box) and then the rest of its words. `box` runs the build sandboxed (its environment seen at `inside`,
    writable) as `owner`; empty: as it is. `env_fd`: the member's environment (seal_env), which it edits (its
    PATH and VIRTUAL_ENV) and which `init` gets as the member does, through envfd's loader."""
    argv = [sys.executable, "-I", __file__, "--env", str(p.path), "--python", p.python, "--reason", str(reason_file)]
    argv += ["--env-fd", str(env_fd)]
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
        mark_ready(env)


def mark_ready(env: Path) -> None:
    """Mark a built environment complete. It was the project's to write while it built (a package's setup.py ran
    there): whatever it left at READY goes, and root makes the mark new, never through a link it planted."""
    ready = env / READY
    with contextlib.suppress(FileNotFoundError):
        os.unlink(ready)
    os.close(os.open(ready, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))


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
    parser.add_argument("--env-fd", type=int, required=True)
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
    member = read_env(ns.env_fd)
    member["VIRTUAL_ENV"] = seen
    member["PATH"] = _path(f"{seen}/bin", member.get("PATH", ""), ns.strip)
    member.pop("PYTHONHOME", None)
    seal_env(member, at=ns.env_fd)
    os.set_inheritable(ns.env_fd, True)
    init = json.loads(ns.init)
    if init:  # in the build's sandbox, which has the network where the member's own may not
        step = [*json.loads(ns.box), *loader_words(ns.env_fd), *init]
        code = subprocess.run(step, check=False, pass_fds=(ns.env_fd,)).returncode
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
