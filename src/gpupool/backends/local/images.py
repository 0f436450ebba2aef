"""A member in an OCI image, run through podman (Debian's) with the sandbox's confinement kept.

The container runs as the project's identity with no capabilities and no_new_privs, a read-only root (podman
mounts private tmpfs on /tmp, /var/tmp and /run), its working directory bound at its own path, its project volumes
bound at theirs (read-only where asked), its CPU and memory requests as limits, and only the GPUs of its
allocation: through CDI (`nvidia.com/gpu=<index>`) where the NVIDIA container toolkit has written a spec, their
device nodes otherwise, and for simulated GPUs the same variables a member without an image gets. Images come
from the host's own storage only (`--pull=never`): nothing is fetched.

The container is named after its allocation (`gpupool-<alloc>`), so a second start of one launch is refused by
podman itself; `podman run` stays attached in the member's wrapper, so the wrapper's lock says whether it runs
across a server restart (runs.py) and its exit status is the container's. The member's variables reach the
container through an env-file that is a memfd of podman's own (`--env-file /proc/self/fd/N`), never spelled out on
a command line others can read, and never in podman's environment: podman runs as root, and its environment
chooses its configuration (CONTAINERS_CONF names the OCI runtime it runs as root). podman gets PODMAN_ENV alone.
This file runs as a script to do that (`python -I images.py ...`), reading the member's environment from the
memfd the launch gives it (envfd.py).

An image is named plainly (`[registry/]name[:tag][@digest]`): a transport (`oci-archive:PATH`, `dir:PATH`,
`docker-daemon:...`) would have root's podman load a file the tenant chose into the host's storage, under a name
every project resolves.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gpupool.backends.local.netns import DNS_FORWARD
from gpupool.models.imageref import refused

CANNOT_START = 97
"""The exit status of a member that never ran (as envs.BUILD_FAILED): its image cannot be used here."""
_NOT_PASSED = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "PWD", "OLDPWD", "SHLVL", "_"})
"""The host's, not the workload's: the image has its own PATH, and HOME is the working directory."""
EXEC_MARKER = "GPUPOOL_EXEC_SESSION"
"""Set in the environment of each `gpupool exec` in an image, a token of its session (see exec_argv)."""
_CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
_NPROC_CAP = 32768
"""podman's monitor (conmon) runs with at most this many processes; a runtime cannot raise a container's limit
above its own without CAP_SYS_RESOURCE, which a VM's or container's root may lack."""


PODMAN_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
              "HOME": "/root"}  # fmt: skip
"""podman's whole environment (root's configuration files, in their system places)."""


@dataclass(frozen=True, slots=True)
class Container:
    name: str
    image: str
    uid: int
    gid: int
    workdir: str
    devices: tuple[str, ...] = ()
    """Device nodes of its GPUs and the driver's (none for simulated GPUs)."""
    cpu_milli: int = 0
    memory_mib: int = 0
    unsupported: str | None = None
    """Why it cannot run in an image here (the member then ends at once, saying so)."""
    reason_file: str = "/dev/null"
    """Where a member that cannot start writes why (its run dir's reason file: see runs.py)."""
    mounts: tuple[tuple[str, str, bool], ...] = ()
    """Project volumes: (host directory, path inside, read-only), bound as the sandbox binds them."""
    seccomp: str | None = None
    """The members' syscall policy as an OCI profile (seccomp.py): podman's default allows namespaces."""
    pids_limit: int | None = None
    """The most processes and threads it may have (the container runs in podman's cgroups, not the member's)."""
    network: str | None = None
    """Its attempt's network namespace (netns.py), or None: the host's."""


def name(alloc_id: str, data_dir: Path) -> str:
    """A member's container: allocation ids repeat between servers (each counts from 1), so the name carries its
    server's data directory too, and two servers on one host never take each other's containers."""
    scope = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:8]
    return f"gpupool-{scope}-{alloc_id}"


def podman() -> str | None:
    return shutil.which("podman")


def global_options() -> list[str]:
    """podman's own options on this host: runc where installed (crun 1.8 refuses a hybrid cgroup v1/v2 host),
    cgroupfs and a file for events where systemd does not run."""
    out = []
    if shutil.which("runc"):
        out.append("--runtime=runc")
    if not Path("/run/systemd/system").is_dir():
        out += ["--cgroup-manager=cgroupfs", "--events-backend=file"]
    return out


def argv(c: Container, command: tuple[str, ...], env_fd: int) -> tuple[str, ...]:
    """The member's command: podman running `command` in its image (or, where it cannot, a line that says why),
    with the member's environment from `env_fd` (envfd.py)."""
    exe = podman()
    why = c.unsupported or (None if exe is not None else "podman is not installed (scripts/system-deps installs it)")
    why = why or refused(c.image)
    if why is not None or exe is None:
        return cannot_start(str(why), Path(c.reason_file))
    # -i: the container's stdin is the member's (the wrapper's FIFO, which never ends), so attach reaches it.
    words = [exe, *global_options(), "run", "--rm", "-i", "--name", c.name, "--pull=never", "--log-driver=none"]
    words += ["--user", f"{c.uid}:{c.gid}", "--cap-drop=all", "--security-opt=no-new-privileges", "--read-only"]
    if c.seccomp is not None:
        words.append(f"--security-opt=seccomp={c.seccomp}")
    if c.network is not None:
        words += [f"--network=ns:{c.network}", f"--dns={DNS_FORWARD}"]
    else:
        words.append("--network=host")
    words += ["-v", f"{c.workdir}:{c.workdir}", "-w", c.workdir, "-e", f"HOME={c.workdir}"]
    for source, inside, read_only in c.mounts:
        # The volume's directory is the project's uid's alone (700), the container runs as that uid: the same
        # identity reaches it in an image as in the sandbox. podman makes the mount point in the image's root.
        words += ["-v", f"{source}:{inside}:{'ro' if read_only else 'rw'}"]
    words += _ulimits()
    if c.memory_mib > 0:
        words.append(f"--memory={c.memory_mib}m")
    if c.cpu_milli > 0:
        words.append(f"--cpus={c.cpu_milli / 1000:g}")
    if c.pids_limit is not None:
        words.append(f"--pids-limit={c.pids_limit}")
    words += _devices(c.devices)
    return (sys.executable, "-I", __file__, str(env_fd), str(len(words)), *words, c.image, *command)


def exec_argv(
    container: str, user: tuple[int, int], workdir: str, command: list[str], tty: bool, marker: str
) -> list[str]:
    """`podman exec` of `command` in a running container: as `user` (the container's own), in `workdir`, with the
    container's environment (what its member was started with, never the caller's), its capabilities (none),
    no_new_privs, cgroups and namespaces, all of which the runtime takes from the container. `marker` is set as
    EXEC_MARKER in the command's environment: podman leaves an exec's processes running when its client goes,
    and the marker is how the caller finds them to end them (`marked`)."""
    exe = podman()
    if exe is None:
        raise FileNotFoundError(2, "podman is not installed")
    words = [exe, *global_options(), "exec", "-i", *(["-t"] if tty else []), "--user", f"{user[0]}:{user[1]}"]
    return [*words, "-w", workdir, "-e", f"{EXEC_MARKER}={marker}", container, *command]


def pid(container: str) -> int | None:
    """The host's pid of a running container's first process (whose namespaces are the container's), or None
    where it does not run."""
    exe = podman()
    if exe is None:
        return None
    done = subprocess.run(
        [exe, *global_options(), "inspect", "--type", "container", "--format", "{{.State.Pid}}", container],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    try:
        value = int(done.stdout.strip()) if done.returncode == 0 else 0
    except ValueError:
        return None
    return value if value > 0 else None


def marked(marker: str, namespace: str | None) -> list[int]:
    """The processes in pid namespace `namespace` whose environment holds EXEC_MARKER=`marker` (one exec's)."""
    needle = f"{EXEC_MARKER}={marker}".encode()
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{entry.name}/ns/pid") != namespace:
                continue
            if needle in Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0"):
                out.append(int(entry.name))
    return sorted(out)


def stop(container: str, grace_s: float) -> None:
    """Stop a container gracefully: its stop signal, then SIGKILL after `grace_s` (whole seconds, rounded up)."""
    exe = podman()
    if exe is None:
        return
    grace = math.ceil(grace_s)
    with contextlib.suppress(subprocess.TimeoutExpired):  # podman hung: the caller's forced stop follows
        subprocess.run(
            [exe, *global_options(), "stop", "--ignore", "--time", str(grace), container],
            capture_output=True,
            timeout=grace + 120,
            check=False,
        )


def remove(container: str) -> None:
    """Stop and remove a container, wherever it is in its life (gone already is fine)."""
    exe = podman()
    if exe is None:
        return
    subprocess.run(
        [exe, *global_options(), "rm", "--force", "--ignore", "--time", "0", container],
        capture_output=True,
        timeout=120,
        check=False,
    )


def _ulimits() -> list[str]:
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    nproc = [
        min(v if v != resource.RLIM_INFINITY else _NPROC_CAP, _NPROC_CAP)
        for v in resource.getrlimit(resource.RLIMIT_NPROC)
    ]
    return [f"--ulimit=nofile={nofile[0]}:{nofile[1]}", f"--ulimit=nproc={nproc[0]}:{nproc[1]}"]


def _devices(nodes: tuple[str, ...]) -> list[str]:
    gpus = [int(m.group(1)) for n in nodes if (m := re.fullmatch(r"/dev/nvidia(\d+)", n))]
    if gpus and _cdi_has_nvidia():
        # CDI brings the driver's nodes and libraries with each GPU; the container sees its GPUs from index 0.
        return [x for i in gpus for x in ("--device", f"nvidia.com/gpu={i}")] + [
            "-e",
            "CUDA_VISIBLE_DEVICES=" + ",".join(str(i) for i in range(len(gpus))),
        ]
    return [x for n in nodes if Path(n).exists() for x in ("--device", n)]


def _cdi_has_nvidia() -> bool:
    for d in _CDI_DIRS:
        for spec in sorted(Path(d).glob("*")) if Path(d).is_dir() else ():
            try:
                if "nvidia.com" in spec.read_text(errors="replace"):
                    return True
            except OSError:
                continue
    return False


def main(args: list[str]) -> None:
    """Run podman with PODMAN_ENV, the member's variables in an env-file of its own (a memfd); those given with a
    value (`-e K=V`) stand. A variable whose value spans lines cannot be written there: the member says so and
    does not start (a partial environment would run it wrongly)."""
    env_fd, count = int(args[0]), int(args[1])
    words, rest = args[2 : 2 + count], args[2 + count :]
    fixed = {w.split("=", 1)[0] for prev, w in itertools.pairwise(words) if prev in ("-e", "--env")}
    size = os.fstat(env_fd).st_size
    member = json.loads(os.pread(env_fd, size, 0)) if size else {}
    os.close(env_fd)
    lines = [f"{k}={v}" for k, v in sorted(member.items()) if k not in _NOT_PASSED and k not in fixed]
    if any("\n" in line or "\r" in line for line in lines):
        print("gpupool: an environment variable's value spans lines, which an image's environment cannot carry")
        sys.exit(CANNOT_START)
    file = os.memfd_create("gpupool-podman-env", 0)
    os.write(file, "".join(f"{line}\n" for line in lines).encode())
    os.execve(words[0], [*words, "--env-file", f"/proc/self/fd/{file}", *rest], PODMAN_ENV)


if __name__ == "__main__":
    main(sys.argv[1:])


def cannot_start(why: str, reason: Path) -> tuple[str, ...]:
    """A launch that only says why it cannot start, in its log and its reason file, and exits CANNOT_START."""
    say = f'echo "gpupool: $0"; printf "%s\\n" "$0" > "$1"; exit {CANNOT_START}'
    return ("/bin/sh", "-c", say, why, str(reason))
