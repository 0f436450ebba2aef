"""Environments on the local backend, for real: a member's own Python environment built with uv from PyPI, and
an image built here and run through podman (no registry is reachable: the image is made from busybox-static)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpupool.backends.base import LaunchSpec
from gpupool.backends.local import LocalBackend, discover
from gpupool.backends.local import images as images_mod
from gpupool.backends.local.envfd import ROOT_ENV
from gpupool.backends.local.envs import BUILD_FAILED, seal_env
from gpupool.backends.local.runs import REASON_BYTES, RunDir, short_reason
from gpupool.backends.local.sandbox import Member, probe
from tests.backends.test_sandbox import _run

UID_BASE = 1_900_000_000
IMAGE = "localhost/gpupool-test-busybox:1"


def _backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(tmp_path / "data", "host", "default", discover("fake:2xH100-80GB"), isolation=probe(False))


def _with_requirements(backend: LocalBackend, workload_id: int, text: str) -> None:
    workdir = backend.workdir(workload_id)
    workdir.mkdir(parents=True)
    (workdir / "requirements.txt").write_text(text)


def test_a_member_runs_in_its_own_environment_built_from_its_requirements(tmp_path: Path) -> None:
    b = _backend(tmp_path)
    server_site = subprocess.run(
        [sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    before = sorted(p.name for p in Path(server_site).iterdir())
    script = (
        "import os, sys, six; print('six', six.__version__); print(sys.prefix); print(os.environ['VIRTUAL_ENV']); "
        f"print({sys.prefix!r} in os.environ['PATH'])"
    )
    argv = ("sh", "-c", f'python -c "{script}" && python -m pip install six; echo "pip=$?"')
    for wid in (1, 2):  # the second reuses the first's environment
        _with_requirements(b, wid, "six==1.17.0\n")
        code, log = _run(b, LaunchSpec(f"{wid}-0-0", wid, "w", "vision", "batch", argv, {}, project_id=5), 180)
        assert code == 0, log
        # The environment's Python, which has no pip to change anything with, and nothing of the server's on PATH.
        assert log.splitlines()[-6:] == [
            "six 1.17.0", "/run/gpupool-env", "/run/gpupool-env", "False",
            "/run/gpupool-env/bin/python: No module named pip", "pip=1",
        ], log  # fmt: skip
    envs = [p for p in (tmp_path / "data" / "envs" / "5").iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert len(envs) == 1
    assert sorted(p.name for p in Path(server_site).iterdir()) == before


def test_a_bad_requirement_fails_the_member_with_uvs_reason(tmp_path: Path) -> None:
    b = _backend(tmp_path)
    _with_requirements(b, 3, "gpupool-no-such-package-xyz==0.0.1\n")
    code, log = _run(b, LaunchSpec("3-0-0", 3, "w", "vision", "batch", ("true",), {}, project_id=5), 180)
    assert code == BUILD_FAILED
    reason = RunDir(tmp_path / "data" / "run").reason("3-0-0")
    assert reason is not None
    assert reason.startswith("its Python environment could not be built from requirements.txt (uv: ")
    assert "gpupool-no-such-package-xyz" in reason
    assert f"gpupool: {reason}" in log
    assert b.observe()["3-0-0"].reason == reason  # what the failed event's detail is made of


def test_a_reason_is_cut_to_its_first_and_last_lines_and_a_kib() -> None:
    lines = [f"line {i}" for i in range(12)]
    assert short_reason("\n".join(lines)).splitlines() == ["line 0", "line 8", "line 9", "line 10", "line 11"]
    long = "é" * 2000  # two bytes each: a cut may not split one
    cut = short_reason(long)
    assert len(cut.encode()) <= REASON_BYTES
    assert cut == "é" * 128 + " … " + "é" * 381


def build_image(root: Path, tag: str = IMAGE) -> str:
    """A tiny image made here: Debian's busybox-static, FROM scratch."""
    (root / "bin").mkdir()
    shutil.copy(shutil.which("busybox") or "/bin/busybox", root / "bin" / "busybox")
    for applet in ("sh", "id", "env", "echo", "grep", "cat", "touch", "sleep", "unshare"):
        (root / "bin" / applet).symlink_to("busybox")
    (root / "Containerfile").write_text('FROM scratch\nCOPY bin /bin\nCMD ["/bin/sh"]\n')
    podman = [shutil.which("podman") or "podman", *images_mod.global_options()]
    subprocess.run([*podman, "build", "-q", "-t", tag, str(root)], check=True, capture_output=True, timeout=300)
    return tag


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_image(tmp_path_factory.mktemp("image"))


def _image_member(tmp_path: Path, alloc: str, image: str) -> Member:
    return Member(
        alloc_id=alloc, project_id=5, project="vision", workdir=tmp_path / "data" / "workloads" / alloc,
        app_dir=tmp_path / "apps" / alloc, private_network=False, port=None, cpu_milli=500, memory_mib=256,
        image=image, kind="batch",
    )  # fmt: skip


def test_an_image_runs_confined_with_its_gpu_variables(tmp_path: Path, image: str) -> None:
    b = _backend(tmp_path)
    member = _image_member(tmp_path, "4-0-0", image)
    b.sandbox.prepare(member)
    script = (
        'id -u; id -g; echo "cuda=$CUDA_VISIBLE_DEVICES"; echo "nvidia=$NVIDIA_VISIBLE_DEVICES"; '
        'echo "w=$GPUPOOL_WORKLOAD"; '
        'echo "secret=$TOKEN"; echo "home=$HOME"; grep ^CapEff /proc/self/status; touch /x 2>/dev/null || echo ro; '
        "echo hi > out && cat out; cat /sys/fs/cgroup/memory/memory.limit_in_bytes; "
        "cat /sys/fs/cgroup/pids/pids.max; "  # the member's pids limit: podman's cgroups, not the member's
        "unshare -U true 2>/dev/null || echo no-userns"  # the members' syscall policy, not podman's default
    )
    env = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "1", "NVIDIA_VISIBLE_DEVICES": "GPU-1", "TOKEN": "s3"}
    env["GPUPOOL_WORKLOAD"] = "w"
    fd = seal_env(env)
    argv, cgroups = b.sandbox.argv(member, ("sh", "-c", script), fd)
    assert cgroups == ()
    assert "s3" not in " ".join(argv)  # a value never on a command line: podman reads it from a memfd of its own
    done = subprocess.run(argv, cwd=member.workdir, env=ROOT_ENV, capture_output=True, text=True, timeout=120,
                          pass_fds=(fd,))  # fmt: skip
    os.close(fd)
    uid = str(UID_BASE + 5)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        uid, uid, "cuda=1", "nvidia=GPU-1", "w=w", "secret=s3", f"home={member.workdir}",
        "CapEff:\t0000000000000000", "ro", "hi", str(256 * 1024 * 1024), "4096", "no-userns",
    ]  # fmt: skip


def test_a_container_starts_once_and_goes_with_its_release(tmp_path: Path, image: str) -> None:
    b = _backend(tmp_path)
    member = _image_member(tmp_path, "5-0-0", image)
    b.sandbox.prepare(member)
    fd = seal_env({"PATH": "/usr/bin:/bin"})
    argv, _ = b.sandbox.argv(member, ("sleep", "300"), fd)
    first = subprocess.Popen(argv, env=ROOT_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(fd,))
    podman = [shutil.which("podman") or "podman", *images_mod.global_options()]

    def running() -> bool:
        name = images_mod.name("5-0-0", b.data_dir)
        ps = subprocess.run([*podman, "ps", "-q", "--filter", f"name=^{name}$"], capture_output=True, text=True)
        return bool(ps.stdout.strip())

    deadline = time.monotonic() + 60
    while not running():
        assert time.monotonic() < deadline, "the container did not start"
        time.sleep(0.1)
    second = subprocess.run(argv, env=ROOT_ENV, capture_output=True, text=True, timeout=60, pass_fds=(fd,))
    os.close(fd)
    assert second.returncode == 125  # its name is taken: podman refuses a second start of one launch
    assert "already in use" in second.stderr
    first.kill()  # its wrapper killed hard: podman's monitor keeps the container running
    first.wait()
    assert running()
    b.sandbox.release("5-0-0")
    assert not running()


def test_a_notebook_or_service_in_an_image_says_it_cannot(tmp_path: Path, image: str) -> None:
    b = _backend(tmp_path)
    spec = LaunchSpec("6-0-0", 6, "w", "vision", "inference", ("sh",), {}, port=8000, project_id=5)
    member = Member("6-0-0", 5, "vision", b.workdir(6), tmp_path / "apps", True, 8000, 0, 0, image=image)
    argv, _ = b.sandbox.argv(member, spec.argv, 99)  # (it says why it cannot run, reading no environment)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == BUILD_FAILED
    assert done.stdout.startswith("gpupool: an image is honoured for batch and training work on the local backend")
    reason = RunDir(tmp_path / "data" / "run").reason("6-0-0")
    assert reason is not None and done.stdout == f"gpupool: {reason}\n"


def test_a_stop_gives_a_container_its_grace(tmp_path: Path, image: str) -> None:
    """The container is no child of the member's wrapper: its stop goes through podman, TERM first."""
    b = _backend(tmp_path)
    script = "trap 'echo TERM; exit 3' TERM; echo up; while :; do sleep 0.1; done"
    argv = ("sh", "-c", script)
    spec = LaunchSpec("7-0-0", 7, "w", "vision", "batch", argv, {}, image=image, grace_s=20, project_id=5)
    b.launch(spec)
    log = Path(b.log_path(7, 0))
    deadline = time.monotonic() + 60
    while "up" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, "the container did not start"
        time.sleep(0.05)
    for _ in range(3):  # asked each cycle: podman is asked once
        b.stop("7-0-0", force=False)
    deadline = time.monotonic() + 15  # well within its grace: it ended on its TERM, not on podman's kill
    while b.observe()["7-0-0"].alive:
        assert time.monotonic() < deadline, "the container did not stop on TERM"
        time.sleep(0.05)
    assert (b.observe()["7-0-0"].exit_code, log.read_text().splitlines()) == (3, ["up", "TERM"])
