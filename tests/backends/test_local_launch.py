"""The local backend launches each allocation exactly once, keeps the best word on how it ended, supervises any
number of members with one thread, and a restarted backend tells running, ended and never-started launches apart.

Real processes throughout; a full disk is a small tmpfs filled up. Members announce their start by appending a
line to a file, and wait on a FIFO the test opens when it wants them to end (open blocks until both ends meet).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpupool import failpoints
from gpupool.backends.base import DeviceGrant, LaunchSpec
from gpupool.backends.local import LocalBackend, discover
from gpupool.backends.local.runs import INTENT_MODE, STARTED_MODE
from tests.e2e.conftest import wait_for

GRANT = (DeviceGrant(1, 250, 20480, "H100", 81920),)


@pytest.fixture
def backends(tmp_path: Path) -> Iterator[Callable[..., LocalBackend]]:
    """Makes backends on a data dir (tmp_path/data by default); on teardown kills what they started."""
    made: list[LocalBackend] = []

    def make(data: Path | None = None) -> LocalBackend:
        b = LocalBackend(data or tmp_path / "data", "host", "default", discover("fake:2xH100-80GB"))
        made.append(b)
        return b

    yield make
    for b in made:
        for alloc in b.observe():
            b.stop(alloc, force=True)
        b.close()


@pytest.fixture
def arm(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Arms failpoints in this process, as GPUPOOL_FAILPOINTS arms them in a server."""

    def set_points(text: str) -> None:
        monkeypatch.setattr(failpoints, "_ARMED", failpoints._parse(text))
        monkeypatch.setattr(failpoints, "_COUNTS", {})

    return set_points


def _spec(alloc: str, starts: Path, then: str = "exit 0") -> LaunchSpec:
    """A member that appends a line to `starts`, then runs `then` (sh; "$1" is `starts`' folder)."""
    argv = ("sh", "-c", f'echo "$GPUPOOL_ALLOCATION" >> "$0"; {then}', str(starts), str(starts.parent))
    return LaunchSpec(alloc, 1, "w", "p", "training", argv, {}, GRANT)


def _waiting(alloc: str, starts: Path, fifo: Path, code: int = 0) -> LaunchSpec:
    """A member that starts, then ends with `code` once `fifo` is opened for writing."""
    if not fifo.exists():
        os.mkfifo(fifo)
    return _spec(alloc, starts, f'read line < "$1/{fifo.name}"; exit {code}')


def _release(fifo: Path) -> None:
    with open(fifo, "w") as f:  # blocks until a member has it open for reading
        f.write("go\n")


def _starts(starts: Path) -> list[str]:
    return starts.read_text().split() if starts.exists() else []


def _ended(b: LocalBackend, alloc: str, timeout: float = 20.0) -> int | None:
    seen = wait_for(lambda: (o := b.observe().get(alloc)) is not None and not o.alive and o, timeout, f"{alloc} ends")
    return seen.exit_code  # type: ignore[no-any-return]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_intent_is_durable_before_the_member_runs(backends: Callable[..., LocalBackend], tmp_path: Path) -> None:
    b = backends()
    run = tmp_path / "data" / "run"
    seen = tmp_path / "seen.json"
    spec = _spec("1-0-0", tmp_path / "starts", f'cat "{run}/1-0-0.json" > "{seen}"')
    b.launch(spec)
    assert _ended(b, "1-0-0") == 0
    assert json.loads(seen.read_text())["devices"] == [[1, 250, 20480]]  # the member found its record there
    assert _mode(run / "1-0-0.lock") == STARTED_MODE


def test_a_fault_before_the_start_starts_nothing_and_the_next_launch_starts_it_once(
    backends: Callable[..., LocalBackend], arm: Callable[[str], None], tmp_path: Path
) -> None:
    arm("launch.before-start=raise")
    b, starts = backends(), tmp_path / "starts"
    spec = _spec("2-0-0", starts, "exec sleep 600")
    with pytest.raises(failpoints.FailpointError):
        b.launch(spec)
    run = tmp_path / "data" / "run"
    intent = {"devices": [[1, 250, 20480]], "enforced": False, "grace_s": 30.0}
    assert json.loads((run / "2-0-0.json").read_text()) == intent
    assert _mode(run / "2-0-0.lock") == INTENT_MODE
    assert b.observe() == {}
    b.launch(spec)  # the failpoint fired once: this one goes through
    b.launch(spec)
    wait_for(lambda: _starts(starts), 20, "the member to start")
    assert _starts(starts) == ["2-0-0"]
    assert b.observe()["2-0-0"].alive


def test_a_never_started_intent_is_dropped_on_restart_and_the_next_launch_starts_it(
    backends: Callable[..., LocalBackend], arm: Callable[[str], None], tmp_path: Path
) -> None:
    arm("launch.before-start=raise")
    starts = tmp_path / "starts"
    spec = _spec("3-0-0", starts, "exec sleep 600")
    with pytest.raises(failpoints.FailpointError):
        backends().launch(spec)
    again = backends()  # as after a restart
    assert again.observe() == {}
    assert sorted(p.name for p in (tmp_path / "data" / "run").iterdir()) == []
    again.launch(spec)
    wait_for(lambda: _starts(starts), 20, "the member to start")
    assert _starts(starts) == ["3-0-0"]


def test_one_allocation_launched_from_eight_threads_at_once_starts_once(
    backends: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    b, starts = backends(), tmp_path / "starts"
    spec = _spec("4-0-0", starts, "exit 3")
    gate = threading.Barrier(8)

    def launch() -> None:
        gate.wait()
        b.launch(spec)

    with ThreadPoolExecutor(8) as pool:
        for f in [pool.submit(launch) for _ in range(8)]:
            f.result()
    assert _ended(b, "4-0-0") == 3
    assert _starts(starts) == ["4-0-0"]


def test_two_hundred_members_are_supervised_by_one_thread(
    backends: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    before = threading.active_count()
    b, starts = backends(), tmp_path / "starts"
    specs = [_spec(f"5-{i}-0", starts, "exec sleep 600") for i in range(200)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(b.launch, specs))
    assert threading.active_count() == before + 1  # the reaper
    wait_for(lambda: len(_starts(starts)) == 200, 60, "200 members to start")
    assert all(o.alive for o in b.observe().values())
    for spec in specs:
        b.stop(spec.alloc_id, force=False)  # TERM: the wrapper outlives it and reports 128 + 15
    wait_for(lambda: not any(o.alive for o in b.observe().values()), 60, "200 members to end")
    assert {o.exit_code for o in b.observe().values()} == {143}
    assert threading.active_count() == before + 1
    assert sorted(_starts(starts)) == sorted(s.alloc_id for s in specs)


def test_a_restarted_backend_adopts_a_running_member_and_never_starts_it_again(
    backends: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    b, starts, fifo = backends(), tmp_path / "starts", tmp_path / "go"
    spec = _waiting("6-0-0", starts, fifo, code=5)
    b.launch(spec)
    wait_for(lambda: _starts(starts), 20, "the member to start")
    again = backends()
    again.launch(spec)
    assert again.observe()["6-0-0"].alive
    _release(fifo)
    assert _ended(again, "6-0-0") == 5  # from the wrapper's exit file: not this backend's child
    assert _ended(b, "6-0-0") == 5
    assert _starts(starts) == ["6-0-0"]


def test_a_member_whose_record_was_never_written_is_found_by_its_lock(
    backends: Callable[..., LocalBackend], arm: Callable[[str], None], tmp_path: Path
) -> None:
    arm("launch.after-start=raise")
    b, starts, fifo = backends(), tmp_path / "starts", tmp_path / "go"
    spec = _waiting("7-0-0", starts, fifo)
    with pytest.raises(failpoints.FailpointError):
        b.launch(spec)
    record = tmp_path / "data" / "run" / "7-0-0.json"
    assert "pid" not in json.loads(record.read_text())
    b.launch(spec)  # the controller retries: it is tracked already
    assert b.observe()["7-0-0"].alive
    wait_for(lambda: _starts(starts), 20, "the member to start")
    again = backends()
    again.launch(spec)
    assert again.observe()["7-0-0"].alive
    pid = json.loads(record.read_text())["pid"]  # found by its lock, and written down
    assert os.getpgid(pid) == pid and Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[3] == b"gpupool-run"
    again.stop("7-0-0", force=True)
    assert _ended(again, "7-0-0") is None  # killed: no status
    assert _starts(starts) == ["7-0-0"]


def test_a_restarted_backend_reports_members_that_ended_while_it_was_down(
    backends: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    b, starts = backends(), tmp_path / "starts"
    exited, killed = _spec("8-0-0", starts, "exit 7"), _spec("8-1-0", starts, "exec sleep 600")
    b.launch(exited)
    b.launch(killed)
    assert _ended(b, "8-0-0") == 7
    wait_for(lambda: len(_starts(starts)) == 2, 20, "both members to start")
    pid = json.loads((tmp_path / "data" / "run" / "8-1-0.json").read_text())["pid"]
    os.killpg(pid, signal.SIGKILL)  # the wrapper too: nothing writes a status
    assert _ended(b, "8-1-0") is None
    again = backends()
    again.launch(exited)
    again.launch(killed)
    seen = again.observe()
    assert (seen["8-0-0"].alive, seen["8-0-0"].exit_code) == (False, 7)
    assert (seen["8-1-0"].alive, seen["8-1-0"].exit_code) == (False, None)
    assert sorted(_starts(starts)) == ["8-0-0", "8-1-0"]
    again.forget("8-0-0")
    assert sorted(p.name for p in (tmp_path / "data" / "run").iterdir()) == ["8-1-0.json", "8-1-0.lock"]


def test_a_record_from_before_launch_locks_is_adopted_by_its_pid(
    backends: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    run = tmp_path / "data" / "run"
    run.mkdir(parents=True)
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    ticks = int(Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    record = {"pid": proc.pid, "start_ticks": ticks, "enforced": False, "devices": [[0, 1000, 81920]]}
    (run / "11-0-0.json").write_text(json.dumps(record))
    b = backends()
    assert b.observe()["11-0-0"].alive
    b.stop("11-0-0", force=True)
    assert proc.wait(20) == -signal.SIGKILL
    assert _ended(b, "11-0-0") is None


# -- a full disk ------------------------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (the tests run as root, as the sandbox's do)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def _fill(disk: Path, leave_pages: int = 0) -> Path:
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
    with pytest.raises(OSError) as full:
        (disk / "probe").write_bytes(b"x")
    assert full.value.errno == errno.ENOSPC
    os.truncate(filler, filler.stat().st_size - 4096 * leave_pages)
    return filler


def test_with_the_disk_full_a_launch_fails_and_starts_nothing(
    backends: Callable[..., LocalBackend], small_disk: Path, tmp_path: Path
) -> None:
    b, starts = backends(small_disk / "data"), tmp_path / "starts"
    spec = _spec("9-0-0", starts, "exit 0")
    filler = _fill(small_disk)
    with pytest.raises(OSError, match="No space left"):
        b.launch(spec)
    assert b.observe() == {}
    filler.unlink()
    b.launch(spec)
    assert _ended(b, "9-0-0") == 0
    assert _starts(starts) == ["9-0-0"]


def test_with_the_disk_full_after_the_intent_the_member_is_tracked_and_its_exit_code_is_the_childs(
    backends: Callable[..., LocalBackend], small_disk: Path, tmp_path: Path
) -> None:
    b, starts, fifo = backends(small_disk / "data"), tmp_path / "starts", tmp_path / "go"
    spec = _waiting("10-0-0", starts, fifo)
    _fill(small_disk, leave_pages=1)  # room for the intent, none for the record nor the exit file
    b.launch(spec)
    run = small_disk / "data" / "run"
    assert "pid" not in json.loads((run / "10-0-0.json").read_text())
    wait_for(lambda: _starts(starts), 20, "the member to start")
    again = backends(small_disk / "data")  # a restart finds it by its lock (and cannot write its pid down)
    assert again.observe()["10-0-0"].alive
    _release(fifo)
    assert _ended(b, "10-0-0") == 0  # its own child's return code
    assert not (run / "10-0-0.exit").exists()
    # Ended while "down" with the disk full: nothing was written, so the restarted one cannot know how.
    assert _ended(again, "10-0-0") is None
    assert _starts(starts) == ["10-0-0"]


ADOPT_AS_SESSION_LEADER = """
import json, os, sys, time
from pathlib import Path
from gpupool.backends.local import LocalBackend, discover
from tests.backends.test_local_launch import _spec
data, starts = Path(sys.argv[1]), Path(sys.argv[2])
first = LocalBackend(data, "host", "default", discover("fake:2xH100-80GB"))
first.launch(_spec("9-0-0", starts, "exec sleep 600"))
deadline = time.monotonic() + 20
while not starts.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
(data / "run" / "9-0-0.json").write_text(json.dumps({"devices": [], "enforced": False}))  # no pid written down
again = LocalBackend(data, "host", "default", discover("fake:2xH100-80GB"))
again.launch(_spec("9-0-0", starts, "exec sleep 600"))
found = json.loads((data / "run" / "9-0-0.json").read_text()).get("pid")
print(json.dumps({"me": os.getpid(), "sid": os.getsid(0), "found": found, "wrapper": first._runs["9-0-0"].pid}))
again.stop("9-0-0", force=True)
"""


def test_a_server_leading_its_own_session_never_takes_itself_for_a_members_wrapper(tmp_path: Path) -> None:
    # Under systemd (or setsid) the server leads its session, as the wrapper does, and holds the lock file open
    # while it tests it: it must find the wrapper, or a stop kills the server's own process group.
    done = subprocess.run(
        [sys.executable, "-c", ADOPT_AS_SESSION_LEADER, str(tmp_path / "data"), str(tmp_path / "starts")],
        capture_output=True, text=True, timeout=60, start_new_session=True, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert (seen["sid"], seen["found"]) == (seen["me"], seen["wrapper"])
