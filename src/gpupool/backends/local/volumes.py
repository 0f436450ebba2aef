"""Project volumes on this host: a filesystem image of the volume's size, loop-mounted, so the kernel enforces
the size (a write past it fails with ENOSPC inside the job).

`<data>/volumes/<project>/<name>.img` (sparse: it takes the room its files take) is made with mkfs.ext4 at the
volume's first mount and mounted at `<data>/volumes/<project>/<name>/`, owned by the project's identity, mode 700;
it stays mounted (members bind it into their sandboxes) until the volume is deleted, which unmounts it and removes
the image. Where this host cannot loop-mount (no loop devices in a container, say), a volume is a plain directory
and its size is advisory: `Volumes.enforced` says which, and the isolation summary shows it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)


class VolumeError(Exception):
    """A volume's storage could not be made or mounted; the message says why."""


def loop_mounts_work() -> bool:
    """Whether this host can loop-mount a filesystem image: root, a free loop device, and mkfs.ext4."""
    if os.geteuid() != 0 or shutil.which("mkfs.ext4") is None or shutil.which("losetup") is None:
        return False
    try:
        found = subprocess.run(["losetup", "-f"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return found.returncode == 0 and found.stdout.startswith("/dev/")


class Volumes:
    def __init__(self, data_dir: Path, enforced: bool) -> None:
        self.root = data_dir / "volumes"
        self.enforced = enforced

    def paths(self, project: str, name: str) -> tuple[Path, Path]:
        """The volume's mount point and its image."""
        base = self.root / project
        return base / name, base / f"{name}.img"

    @contextlib.contextmanager
    def _locked(self, project: str, name: str) -> Iterator[None]:
        """One mount or removal of a volume at a time (members launched in parallel share it)."""
        base = self.root / project
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(base / f".{name}.lock", os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def ensure(self, project: str, name: str, size_bytes: int, uid: int | None) -> Path:
        """The volume's directory, made and mounted where it was not (idempotent); `uid` is to own it."""
        mount, image = self.paths(project, name)
        with self._locked(project, name):
            mount.mkdir(mode=0o700, exist_ok=True)
            if self.enforced and not os.path.ismount(mount):
                if not image.exists():
                    self._make_image(image, size_bytes, uid)
                done = subprocess.run(["mount", "-o", "loop,nodev,nosuid", str(image), str(mount)],
                                      capture_output=True, text=True, timeout=60)  # fmt: skip
                if done.returncode != 0:
                    raise VolumeError(f"volume {project}/{name} could not be mounted: {done.stderr.strip()[:300]}")
                # A fresh filesystem's lost+found is root's: out of the way of the project's own files.
                shutil.rmtree(mount / "lost+found", ignore_errors=True)
            os.chmod(mount, 0o700)
            if uid is not None:
                os.chown(mount, uid, uid)
        return mount

    def _make_image(self, image: Path, size_bytes: int, uid: int | None) -> None:
        tmp = image.with_name(f".{image.name}.making")
        with open(tmp, "wb") as f:
            f.truncate(size_bytes)
        owner = [] if uid is None else ["-E", f"root_owner={uid}:{uid}"]
        done = subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", *owner, str(tmp)],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        if done.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise VolumeError(f"mkfs.ext4 failed for {image.name}: {done.stderr.strip()[:300]}")
        tmp.replace(image)

    def remove(self, project: str, name: str) -> None:
        """Unmount the volume and remove its image and directory (a deleted volume)."""
        mount, image = self.paths(project, name)
        with self._locked(project, name):
            if os.path.ismount(mount):
                done = subprocess.run(["umount", str(mount)], capture_output=True, text=True, timeout=60)
                if done.returncode != 0:  # still held by a process that outlived its member: detach it now
                    log.warning("volume %s/%s busy (%s); detaching it lazily", project, name, done.stderr.strip())
                    subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=60)
            shutil.rmtree(mount, ignore_errors=True)
            image.unlink(missing_ok=True)
        with contextlib.suppress(FileNotFoundError):
            (self.root / project / f".{name}.lock").unlink()


def volume_words(enforced: bool) -> str:
    """What the isolation summary says of volumes."""
    if enforced:
        return "enforced: a loop-mounted filesystem of the volume's size, the project's uid alone (700)"
    return "size: advisory (this host cannot loop-mount); a directory of the project's uid alone (700)"
