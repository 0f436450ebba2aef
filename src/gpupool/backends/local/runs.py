"""Launch records and locks: how a launch starts exactly once, and how a restarted server tells a member that
runs from one that ended (and how) and from one that never started.

Each allocation has, in `<data>/run/`:

* `<alloc>.json`, its record. It is written durably (a temporary file, fsync, rename, fsync of the directory)
  BEFORE anything starts: the launch's intent, with what adoption needs (the devices it holds, whether its
  fraction is enforced). A failed intent write fails the launch, and nothing starts; the controller tries again
  next cycle. Once the wrapper runs, the record is rewritten with its pid and start time, best effort: if that
  write fails (the disk is full, the server dies first) the member runs on, tracked in memory, and a restarted
  server finds it by its lock.
* `<alloc>.lock`, made with the intent. The server takes `flock(LOCK_EX)` on it before it starts the wrapper and
  hands the open file to the wrapper as its stdin, then closes its own descriptor: the lock is held exactly as
  long as the wrapper lives, whoever its parent is by then. (The member gets another stdin, below: it can neither
  drop the lock nor keep it after the wrapper.) The wrapper marks the file started (its mode, a change of
  metadata that a full disk allows) before it runs the member.
* `<alloc>.stdin`, for a moment: a FIFO the wrapper makes, opens read-write (on its descriptor STDIN_FD) and
  removes at once; the member gets it as its stdin. `gpupool attach` (backends/local/shell.py) reaches it through
  the wrapper's descriptor of it (`member_stdin`), never by a path: the member reads what attached
  clients send, and never sees an end of its input (as a Kubernetes container with `stdin: true`).
* `<alloc>.exit`, the member's exit status, which the wrapper writes when it ends (with the disk full it cannot:
  the server's own child's return code, which it reaps, says the same).
* `<alloc>.reason`, why a member never ran, where it could say (its Python environment could not be built: uv's
  last lines, see envs.py; its image cannot run here, see images.py), beside an exit status of envs.BUILD_FAILED.
  A failed member's event carries it (`Observed.reason`), cut short.

What a restarted server concludes (`survey`): the lock held → it runs (its pid from the record, or else the
session leader that has the lock file open); not held and an exit file → it ended with that status; not held, no
exit file, marked started → it ended without a status (killed); not held and never marked → it never started:
the intent is dropped, and the controller, which never saw that launch succeed, launches it again.

A power loss stops every member with the server; what it can cost is a launch whose start mark had not reached
the disk, which then runs again from the beginning.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

INTENT_MODE = 0o600
STARTED_MODE = 0o400
STDIN_FD = 3
"""The wrapper's descriptor of its member's stdin (a FIFO's read-write end), until it runs the member (its shell
may move it then)."""
REASON_LINES = 5
REASON_BYTES = 1024
"""A failure's reason, as its event carries it: a few lines, at most 1 KiB (the whole story is in the log)."""

# "$1" is the exit file, "$2" the lock file (also the wrapper's stdin), "$3" the number of cgroup.procs files
# that follow (the wrapper joins them first, so everything the member starts is counted); the rest is the
# member's argv, run without any shell interpretation of its words. The wrapper catches TERM (its child gets the
# default action back on exec) so it outlives the grace period and records how the member really ended. It runs
# as the server's user, outside the sandbox, which is what lets it write the exit file where the member cannot.
_WRAPPER = (
    "trap : TERM INT; f=$1; s=${1%.exit}.stdin; n=$3; "
    f'chmod {STARTED_MODE:o} "$2" </dev/null || exit 125; shift 3; rc=0; '
    f'rm -f "$s"; mkfifo -m 600 "$s" && exec {STDIN_FD}<>"$s" && rm -f "$s" || rc=125; '
    'while [ "$n" -gt 0 ]; do echo $$ > "$1" || rc=125; shift; n=$((n-1)); done; '
    f'[ $rc -eq 0 ] && {{ "$@" <&{STDIN_FD} {STDIN_FD}<&-; rc=$?; }}; '
    'printf "%s" "$rc" > "$f.tmp" && mv "$f.tmp" "$f"; exit $rc'
)


@dataclass(frozen=True, slots=True)
class Record:
    devices: tuple[tuple[int, int, int], ...] = ()
    """(index, milli, memory MiB) of each device it holds."""
    enforced: bool = False
    pid: int | None = None
    """The wrapper's, once it runs (its process group is the member's)."""
    start_ticks: int | None = None
    grace_s: float | None = None
    """Its grace period, for a stop asked of it after a restart (a container's is podman's to give)."""


@dataclass(frozen=True, slots=True)
class Found:
    """What a restarted server finds of one launch."""

    record: Record
    running: bool
    pid: int | None
    start_ticks: int | None


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)

    def record_path(self, alloc_id: str) -> Path:
        return self.path / f"{alloc_id}.json"

    def lock_path(self, alloc_id: str) -> Path:
        return self.path / f"{alloc_id}.lock"

    def exit_path(self, alloc_id: str) -> Path:
        return self.path / f"{alloc_id}.exit"

    def stdin_path(self, alloc_id: str) -> Path:
        """Where the wrapper makes its member's stdin FIFO, which it removes once open (see the docstring)."""
        return self.path / f"{alloc_id}.stdin"

    def member_stdin(self, alloc_id: str, wrapper_pid: int) -> str | None:
        """A path that opens the member's stdin FIFO while its wrapper lives (for the server, root or the wrapper's
        own user): the wrapper's descriptor of it, wherever its shell keeps it while the member runs."""
        name = str(self.stdin_path(alloc_id))
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{wrapper_pid}/fd"):
                link = f"/proc/{wrapper_pid}/fd/{fd}"
                with contextlib.suppress(OSError):
                    if os.readlink(link) in (name, f"{name} (deleted)") and stat.S_ISFIFO(os.stat(link).st_mode):
                        return link
        return None

    def wrapper(self, alloc_id: str, cgroups: tuple[str, ...]) -> list[str]:
        exit_file, lock = self.exit_path(alloc_id), self.lock_path(alloc_id)
        return ["/bin/sh", "-c", _WRAPPER, "gpupool-run", str(exit_file), str(lock), str(len(cgroups)), *cgroups]

    def claim(self, alloc_id: str) -> int | None:
        """The allocation's lock file, opened (made if need be) and locked: its descriptor, or None where another
        holds it (its wrapper runs, or another launch of it is under way)."""
        path = self.lock_path(alloc_id)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, INTENT_MODE)
            os.fchmod(fd, INTENT_MODE)  # whatever the umask: only the wrapper's mark may read as started
        except FileExistsError:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        return fd

    def started(self, alloc_id: str, lock_fd: int, record: Record | None) -> bool:
        """Whether this launch's wrapper ever ran (asked while holding its lock)."""
        if stat.S_IMODE(os.fstat(lock_fd).st_mode) == STARTED_MODE:
            return True
        return (record is not None and record.pid is not None) or self.exit_path(alloc_id).exists()

    def write_intent(self, alloc_id: str, record: Record) -> None:
        """Durable before anything starts: written, synced, renamed into place, and the directory synced (which
        makes the lock file's entry durable too)."""
        self._write(alloc_id, record, durable=True)

    def write_record(self, alloc_id: str, record: Record) -> None:
        """The record with the wrapper's pid: a hint, not synced; the lock is what proves a start."""
        self._write(alloc_id, record, durable=False)

    def read(self, alloc_id: str) -> Record | None:
        try:
            data = json.loads(self.record_path(alloc_id).read_text())
            devices = tuple((int(i), int(m), int(mem)) for i, m, mem in data.get("devices", ()))
            pid, ticks = data.get("pid"), data.get("start_ticks")
            enforced = bool(data.get("enforced", False))
            grace = data.get("grace_s")
            return Record(
                devices,
                enforced,
                None if pid is None else int(pid),
                None if ticks is None else int(ticks),
                None if grace is None else float(grace),
            )
        except (OSError, ValueError, TypeError):
            return None

    def reason_path(self, alloc_id: str) -> Path:
        return self.path / f"{alloc_id}.reason"

    def reason(self, alloc_id: str) -> str | None:
        """Why the member never ran, where its launch could say (envs.py, images.py write it), kept short for an
        event: its first line (what failed) and its last lines (the tool's own words), at most REASON_BYTES."""
        try:
            text = self.reason_path(alloc_id).read_text(errors="replace").strip()
        except OSError:
            return None
        return short_reason(text) or None

    def exit_code(self, alloc_id: str) -> int | None:
        try:
            return int(self.exit_path(alloc_id).read_text())
        except (OSError, ValueError):
            return None

    def allocations(self) -> list[str]:
        return sorted(p.stem for p in self.path.glob("*.json"))

    def remove(self, alloc_id: str) -> None:
        # The record first: without it nothing is adopted, and what is left is swept at the next start.
        paths = (self.record_path(alloc_id), self.exit_path(alloc_id), self.reason_path(alloc_id),
                 self.stdin_path(alloc_id))  # fmt: skip
        for path in (*paths, self.lock_path(alloc_id)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def survey(self, alloc_id: str) -> Found | None:
        """What became of a launch while no server watched it; None where it never started (its intent is then
        dropped: a later launch of it starts it)."""
        record = self.read(alloc_id)
        try:
            fd = os.open(self.lock_path(alloc_id), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return self._legacy(alloc_id, record)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return self._running(alloc_id, record or Record())
            if not self.started(alloc_id, fd, record):
                self.remove(alloc_id)  # under its lock: nobody is starting it meanwhile
                return None
            record = record or Record()
            return Found(record, False, record.pid, record.start_ticks)
        finally:
            os.close(fd)

    def held(self, alloc_id: str) -> bool:
        return _held(self.lock_path(alloc_id))

    def holder(self, alloc_id: str) -> int | None:
        """The process that holds this launch's lock file open and leads its own session: its wrapper. (Not only
        as its stdin: while a command of the wrapper's runs with another stdin, the shell keeps the lock file on a
        descriptor of its choosing.)"""
        try:
            lock = os.stat(self.lock_path(alloc_id))
        except FileNotFoundError:
            return None
        me = os.getpid()
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            if pid == me:
                # The server opens the lock file itself to test it, and under systemd (or setsid) it leads its
                # own session: taken for the wrapper, a stop would kill the server's process group.
                continue
            try:
                if os.getsid(pid) != pid:
                    continue
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                with contextlib.suppress(OSError):
                    st = os.stat(f"/proc/{pid}/fd/{fd}")
                    if (st.st_dev, st.st_ino) == (lock.st_dev, lock.st_ino):
                        return pid
        return None

    def sweep(self) -> None:
        """Remove what a crash left half made: records being written, and lock or exit files without a record.
        (Not a wrapper's exit file being written, `<alloc>.exit.tmp`: the wrapper may be about to rename it.)"""
        records = set(self.allocations())
        for path in self.path.iterdir():
            orphan = path.suffix in (".lock", ".exit", ".reason", ".stdin") and path.stem not in records
            half_written = path.suffix == ".tmp" and ".json." in path.name
            if half_written or (orphan and not (path.suffix == ".lock" and _held(path))):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    # -- internals -----------------------------------------------------------------------------------------
    def _running(self, alloc_id: str, record: Record) -> Found:
        pid, ticks = record.pid, record.start_ticks
        if pid is None or ticks is None or start_ticks(pid) != ticks:
            pid = self.holder(alloc_id)
            ticks = start_ticks(pid) if pid is not None else None
        return Found(record, True, pid, ticks)

    def _legacy(self, alloc_id: str, record: Record | None) -> Found | None:
        """A record from before launch locks: alive while its pid is the process it started."""
        if record is None or record.pid is None:
            with contextlib.suppress(FileNotFoundError):
                self.record_path(alloc_id).unlink()
            return None
        alive = start_ticks(record.pid) == record.start_ticks and not zombie(record.pid)
        return Found(record, alive, record.pid, record.start_ticks)

    def _write(self, alloc_id: str, record: Record, durable: bool) -> None:
        data: dict[str, object] = {"devices": record.devices, "enforced": record.enforced}
        if record.grace_s is not None:
            data["grace_s"] = record.grace_s
        if record.pid is not None:
            data |= {"pid": record.pid, "start_ticks": record.start_ticks}
        final = self.record_path(alloc_id)
        tmp = final.with_name(f"{final.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "w") as f:
                f.write(json.dumps(data))
                f.flush()
                if durable:
                    os.fsync(f.fileno())
            tmp.replace(final)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        if durable:
            dir_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)


def short_reason(text: str) -> str:
    """`text` cut to REASON_LINES lines (its first and its last ones) and REASON_BYTES bytes of UTF-8 (its start and
    its end, a '…' between)."""
    lines = text.splitlines()
    if len(lines) > REASON_LINES:
        lines = [lines[0], *lines[-(REASON_LINES - 1) :]]
    raw = "\n".join(lines).encode()
    if len(raw) <= REASON_BYTES:
        return raw.decode()
    gap = " … ".encode()
    head = REASON_BYTES // 4
    tail = REASON_BYTES - head - len(gap)
    # A character cut in two is dropped, not mangled.
    return raw[:head].decode(errors="ignore") + " … " + raw[-tail:].decode(errors="ignore")


def _held(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        return e.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    finally:
        os.close(fd)
    return False


def start_ticks(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text.rsplit(")", 1)[1].split()[19])


def zombie(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return text.rsplit(")", 1)[1].split()[0] == "Z"
