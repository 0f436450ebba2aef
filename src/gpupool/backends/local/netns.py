"""A network of its own for each local workload attempt, as a pod has.

Each attempt gets a network namespace bound to a file under the data directory (`unshare --net=FILE`), which the
members of a gang join (they talk over its loopback, MASTER_ADDR 127.0.0.1) and nothing else does: another
workload's ports, the server's internal ports and every service bound to the host's loopback are out of reach, and
/proc/net shows the attempt's own sockets only. Outbound traffic goes through pasta (Debian's passt), a user-space
NAT: the namespace has an address of its own (ADDRESS, Podman's default network), so the host's external addresses
are reached as any machine on the network reaches them, and the host's loopback is never mapped (`--no-map-gw`)
except the API's port, forwarded so a workload calls GPUPOOL_URL at 127.0.0.1. DNS goes to DNS_FORWARD, which pasta
hands to the host's own resolver (a loopback stub such as systemd-resolved's included).

pasta runs as root (`--runas 0`): it must join a namespace owned by the host's user namespace, which an
unprivileged identity cannot; it sandboxes itself after that (its own namespaces and a seccomp filter). Deleting
the namespace's file ends it.

A project an admin grants the host network skips all of this (`describe` says so).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from gpupool.backends.local import envfd

log = logging.getLogger(__name__)

ADDRESS, PREFIX, GATEWAY = "10.88.0.2", "24", "10.88.0.1"
_NO_WAY_OUT = ("No external routable interface", "External interface not usable")
"""What pasta says where the host has no route out."""
_LOOPBACK_UP = (
    "import fcntl, socket, struct\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "flags = struct.unpack('16sH', fcntl.ioctl(s, 0x8913, struct.pack('16sH14x', b'lo', 0))[:18])[1]\n"
    "fcntl.ioctl(s, 0x8914, struct.pack('16sH14x', b'lo', flags | 1))\n"
)
"""The new namespace's loopback brought up (SIOCGIFFLAGS, SIOCSIFFLAGS with IFF_UP), by the server's own Python:
pasta does it too, but a host with no route out has no pasta."""
DNS_FORWARD = "10.88.0.3"
MNT_DETACH = 2


class NetworkError(Exception):
    """The namespace could not be made; the member does not start."""


def missing() -> str | None:
    """What this host lacks for private networks, or None."""
    for tool, package in (("pasta", "passt"), ("unshare", "util-linux"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed: install Debian's {package}"
    return None


def attempt_key(alloc_id: str) -> str:
    """The members of one attempt share a network: ids are `<workload>-<attempt>-<member>`."""
    return alloc_id.rsplit("-", 1)[0]


class Networks:
    def __init__(self, root: Path, forward: tuple[int, ...]) -> None:
        self.root = root
        self.forward = forward
        """Ports of the host's loopback a workload reaches at its own (the API's)."""
        self._lock = threading.Lock()

    def path(self, alloc_id: str) -> Path:
        return self.root / attempt_key(alloc_id)

    def resolv(self, alloc_id: str) -> Path:
        return self.root / f"{attempt_key(alloc_id)}.resolv"

    def ensure(self, alloc_id: str) -> Path:
        """The attempt's namespace, made (with its NAT) if it is not there: idempotent, and a half-made one left
        by a crash is finished."""
        path, pidfile = self.path(alloc_id), self.root / f"{attempt_key(alloc_id)}.pasta"
        with self._lock:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not _bound(path):
                path.touch(mode=0o600)
                made = subprocess.run(
                    ["unshare", f"--net={path}", "--", sys.executable, "-I", "-S", "-c", _LOOPBACK_UP],
                    capture_output=True, text=True, timeout=30, env=envfd.ROOT_ENV, check=False,
                )  # fmt: skip
                if made.returncode != 0 or not _bound(path):
                    raise NetworkError(f"its network namespace could not be made: {made.stderr.strip()}")
            resolv = self.resolv(alloc_id)
            if not resolv.exists():
                tmp = resolv.with_name(resolv.name + ".tmp")
                tmp.write_text(f"nameserver {DNS_FORWARD}\n")
                os.chmod(tmp, 0o644)
                tmp.replace(resolv)
            if not _pasta_serves(pidfile, path):
                self._start_pasta(path, pidfile)
        return path

    def _start_pasta(self, path: Path, pidfile: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            pidfile.unlink()
        tcp = ",".join(str(p) for p in self.forward) or "none"
        argv = [
            "pasta", "-4", "--config-net", "-a", ADDRESS, "-n", PREFIX, "-g", GATEWAY, "--no-map-gw",
            "--dns-forward", DNS_FORWARD, "-t", "none", "-u", "none", "-T", tcp, "-U", "none",
            "-q", "-P", str(pidfile), "--runas", "0", "--netns", str(path),
        ]  # fmt: skip
        proc = subprocess.Popen(
            argv, env=envfd.ROOT_ENV, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
        )  # fmt: skip
        # pasta writes its pid file once the namespace is configured; a member started before would find no route.
        for _ in range(300):
            if pidfile.exists() and pidfile.stat().st_size > 0:
                break
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
                if any(line in err for line in _NO_WAY_OUT):
                    # A host with no route out (air-gapped): the member runs on its loopback alone, where an
                    # outage of every launch would help no one.
                    log.warning("this host has no route out: workload networks have no way out (%s)", err)
                    return
                raise NetworkError(f"its network's NAT (pasta) did not start: {err or proc.returncode}")
            threading.Event().wait(0.02)
        else:
            proc.kill()
            raise NetworkError("its network's NAT (pasta) did not come up in 6 s")
        threading.Thread(target=proc.wait, name="gpupool-pasta", daemon=True).start()  # reaped when it ends

    def revive(self, alloc_id: str) -> None:
        """After a restart: the NAT of a namespace that is still there started again where it is gone (a service
        manager's restart ends the server's whole cgroup, pasta included, while members run on)."""
        path, pidfile = self.path(alloc_id), self.root / f"{attempt_key(alloc_id)}.pasta"
        with self._lock:
            if _bound(path) and not _pasta_serves(pidfile, path):
                self._start_pasta(path, pidfile)

    def release(self, alloc_id: str, remove: bool = False) -> None:
        """The attempt's namespace unmounted: its pasta ends with it (it watches the mount). The empty file it was
        mounted on stays until `remove` (a sweep, when nothing launches): bubblewrap binds the whole system into
        each sandbox, submounts included, and remounts each read-only by its path; a namespace's file removed in
        between failed that sandbox ("Can't bind mount /oldroot/ ... No such file or directory")."""
        path = self.path(alloc_id)
        with self._lock:
            if _bound(path):
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.umount2(str(path).encode(), MNT_DETACH) != 0:
                    log.warning("network %s: unmount failed (%s)", path.name, os.strerror(ctypes.get_errno()))
                    return
            for p in (self.resolv(alloc_id), self.root / f"{attempt_key(alloc_id)}.pasta", *([path] if remove else [])):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()


def sweep(root: Path, keep: frozenset[str] = frozenset()) -> None:
    """Remove every namespace under `root` but those of the attempts in `keep`, with their files (a server's
    leftovers, at its start, before it launches anything)."""
    for f in root.iterdir() if root.is_dir() else ():
        if "." not in f.name and f.name not in keep:
            Networks(root, ()).release(f"{f.name}-0", remove=True)


def _bound(path: Path) -> bool:
    """Whether a namespace is mounted at `path` (nsfs is a filesystem of its own)."""
    try:
        return path.stat().st_dev != path.parent.stat().st_dev
    except FileNotFoundError:
        return False


def _pasta_serves(pidfile: Path, path: Path) -> bool:
    try:
        pid = int(pidfile.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if os.stat(f"/proc/{pid}").st_uid != 0:  # a tenant's process may name itself anything
            return False
    except (OSError, ValueError):
        return False
    return bool(cmdline) and os.path.basename(cmdline[0]) == b"pasta" and str(path).encode() in cmdline
