"""The local sandbox on this host: what a member runs as and sees, and how its requests become limits."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest

from gpupool.backends.base import LaunchSpec
from gpupool.backends.local import LocalBackend, discover
from gpupool.backends.local.envs import loader_words
from gpupool.backends.local.sandbox import Isolation, Limits, Member, Sandbox, probe

UID_BASE = 1_900_000_000


def _member(tmp_path: Path, **kw: object) -> Member:
    fields: dict[str, object] = {
        "alloc_id": "7-0-0", "project_id": 5, "project": "vision", "workdir": tmp_path / "data" / "workloads" / "7",
        "app_dir": tmp_path / "apps" / "7-0-0", "private_network": False, "port": None, "cpu_milli": 0,
        "memory_mib": 0,
    }  # fmt: skip
    fields.update(kw)
    return Member(**fields)  # type: ignore[arg-type]


ENV_FD = 99
"""A member environment's descriptor, for tests that read the command's words without running it."""


def _run(backend: LocalBackend, spec: LaunchSpec, timeout: float = 20.0) -> tuple[int | None, str]:
    backend.launch(spec)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = backend.observe()[spec.alloc_id]
        if not seen.alive:
            return seen.exit_code, Path(backend.log_path(spec.workload_id, spec.rank)).read_text()
        time.sleep(0.02)
    raise AssertionError(f"{spec.alloc_id} did not end")


def test_a_member_runs_as_its_projects_identity_in_its_own_views(tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = LocalBackend(data, "host", "default", discover("fake:1xH100-80GB"), isolation=probe(False))
    marker = Path(tempfile.mkdtemp(prefix="gpupool-host-tmp-"))
    script = (
        'id -u; id -g; id -G; whoami; echo "home=$HOME"; pwd; test -e "$1" && echo "host /tmp" || echo "own /tmp"; '
        'ls /proc > /tmp/procs; grep -c "^[0-9]" /tmp/procs; ls -A "$0"; '
        "grep ^CapEff /proc/self/status; grep ^NoNewPrivs /proc/self/status"
    )
    argv = ("sh", "-c", script, str(data), str(marker))
    spec = LaunchSpec("1-0-0", 1, "w", "vision", "training", argv, {}, project_id=5)
    code, log = _run(b, spec)
    workdir = data / "workloads" / "1"
    uid = str(UID_BASE + 5)
    assert code == 0, log
    assert log.splitlines() == [
        uid, uid, uid, "gpupool-vision", f"home={workdir}", str(workdir),
        "own /tmp",
        "3",  # its own PID view: the sandbox's keeper, the shell and its ls
        "workloads",  # the data dir: nothing but the way to its own workdir
        "CapEff:\t0000000000000000", "NoNewPrivs:\t1",
    ]  # fmt: skip
    assert workdir.stat().st_uid == UID_BASE + 5 and workdir.stat().st_mode & 0o777 == 0o700
    marker.rmdir()


def test_cpu_and_memory_requests_become_cgroup_limits(tmp_path: Path) -> None:
    isolation = probe(False)
    if isolation.limits.mode not in ("cgroup-v1", "cgroup-v2"):
        pytest.fail(f"this host gives the server no cgroups to delegate ({isolation.limits.mode})")
    box = Sandbox(tmp_path / "data", isolation, UID_BASE)
    member = _member(tmp_path, cpu_milli=1500, memory_mib=256)
    box.prepare(member)
    _argv, procs = box.argv(member, ("true",), ENV_FD)
    limits = {Path(p).parent.name for p in procs}
    # Named for the allocation and this server's data dir: another server on this host (in the same cgroup) has
    # an allocation 7-0-0 of its own, whose limits must not be these.
    other = Sandbox(tmp_path / "other", isolation, UID_BASE)
    assert limits == {box.cgroup_name("7-0-0")} and box.cgroup_name("7-0-0") != other.cgroup_name("7-0-0")
    assert box.cgroup_name("7-0-0").endswith("-7-0-0")
    mem_dir = (isolation.limits.root or Path()) / box.cgroup_name("7-0-0")
    cpu_dir = (isolation.limits.cpu_root or isolation.limits.root or Path()) / box.cgroup_name("7-0-0")
    if isolation.limits.mode == "cgroup-v1":
        assert (mem_dir / "memory.limit_in_bytes").read_text().strip() == str(256 * 1024 * 1024)
        assert (cpu_dir / "cpu.cfs_quota_us").read_text().strip() == "150000"
        assert (cpu_dir / "cpu.cfs_period_us").read_text().strip() == "100000"
    else:
        assert (mem_dir / "memory.max").read_text().strip() == str(256 * 1024 * 1024)
        assert (cpu_dir / "cpu.max").read_text().strip() == "150000 100000"
    box.release("7-0-0")
    assert not mem_dir.exists() and not cpu_dir.exists()


def test_a_member_over_its_memory_limit_is_killed(tmp_path: Path) -> None:
    isolation = probe(False)
    assert isolation.limits.mode != "advisory"
    b = LocalBackend(tmp_path / "data", "host", "default", discover("fake:1xH100-80GB"), isolation=isolation)
    grow = "b = bytearray(64 << 20); print('64 MiB', flush=True); c = bytearray(512 << 20); print('576 MiB')"
    spec = LaunchSpec("1-0-0", 1, "w", "p", "training", ("/usr/bin/python3", "-c", grow), {}, project_id=1,
                      memory_mib=256)  # fmt: skip
    code, log = _run(b, spec)
    assert (code, log) == (137, "64 MiB\n")


def test_a_service_gets_a_network_of_its_own_bridged_to_its_app_socket(tmp_path: Path) -> None:
    box = Sandbox(tmp_path / "data", Isolation(True, Limits("advisory")), UID_BASE)
    argv, _ = box.argv(_member(tmp_path, private_network=True, port=8000), ("serve",), ENV_FD)
    assert "--unshare-net" in argv
    bridge = next(a for a in argv if a.startswith("socat "))
    assert bridge == (
        'socat UNIX-LISTEN:/run/gpupool/app.sock,fork,mode=600,unlink-early TCP:127.0.0.1:8000 & exec "$@"'
    )
    assert argv[-1] == "serve"
    notebook, _ = box.argv(_member(tmp_path), ("lab",), ENV_FD)
    assert "--unshare-net" not in notebook and "socat" not in " ".join(notebook)


def test_on_a_systemd_host_a_scope_carries_the_limits(tmp_path: Path) -> None:
    box = Sandbox(tmp_path / "data", Isolation(True, Limits("systemd", pids=True)), UID_BASE, pids_limit=500)
    argv, procs = box.argv(_member(tmp_path, cpu_milli=2500, memory_mib=1024), ("train",), ENV_FD)
    assert procs == ()
    assert argv[: argv.index("--") + 1] == (
        "systemd-run", "--scope", "--quiet", "--collect", "--unit=gpupool-7-0-0", "--property=MemoryMax=1024M",
        "--property=CPUQuota=250%", "--property=TasksMax=500", "--",
    )  # fmt: skip


def test_single_user_mode_runs_commands_as_they_are(tmp_path: Path) -> None:
    box = Sandbox(tmp_path / "data", probe(True), UID_BASE)
    argv, procs = box.argv(_member(tmp_path), ("python", "train.py"), ENV_FD)
    # As they are, in a Python environment of their own (envs.py builds it, then runs them with the member's
    # environment, from its memfd).
    assert argv[argv.index("--") :] == ("--", *loader_words(ENV_FD), "python", "train.py")
    assert procs == ()
    assert probe(True).summary()["identity"].startswith("advisory")


def test_a_gpu_is_bound_in_by_its_device_node_not_its_index() -> None:
    from gpupool.backends.local.gpus import Discovered
    from gpupool.core import Device

    found = Discovered((Device(0, "H100", 81920), Device(1, "H100", 81920)), False, ("GPU-a", "GPU-b"), (3, 1))
    assert [found.device_node(0), found.device_node(1)] == ["/dev/nvidia3", "/dev/nvidia1"]
