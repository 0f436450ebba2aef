"""Environments end to end, against a real server process with simulated GPUs and its sandbox on: uploaded code
runs in a Python environment built from its requirements.txt (PyPI), never the server's venv; an image built here
(busybox-static, FROM scratch) runs through podman with its allocation's GPU variables; a bad requirement fails
the workload with uv's reason in its failed event; and a container outlives a killed server, is adopted by the
restarted one, and is stopped with its grace by a cancel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpupool.backends.local import images
from gpupool.client import Client
from gpupool.client.code import upload
from gpupool.models.schemas import WorkloadCreate
from tests.backends.test_environments import build_image
from tests.e2e.conftest import Server, wait_for

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # nothing here depends on the store

IMAGE = "localhost/gpupool-e2e-busybox:1"


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_image(tmp_path_factory.mktemp("image"), IMAGE)


def _podman(*args: str) -> str:
    podman = [shutil.which("podman") or "podman", *images.global_options()]
    return subprocess.run([*podman, *args], capture_output=True, text=True, timeout=60, check=True).stdout


def _containers(s: Server, alloc_id: str) -> list[str]:
    """The ids of the containers (running or not) of one allocation of this server's."""
    name = images.name(alloc_id, s.data_dir)
    return _podman("ps", "-a", "--filter", f"name=^{name}$", "--format", "{{.ID}}").split()


@pytest.fixture
def server(make_server: Callable[..., Server], monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Server, Client]]:
    """A server whose own PATH leads with its venv (so a workload that inherited it would show it), with project
    vision and its member ana. Containers its workloads left are removed afterwards (their names are global)."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    s = make_server("fake:4xH100-80GB")
    s.cli("project", "create", "vision", "--deserved-gpus", "4")
    ana = s.client(s.json("user", "create", "ana", "--project", "vision")["token"])
    yield s, ana
    s.kill()
    s.stop_workloads()


def _log(ana: Client, name: str) -> str:
    return ana.logs(name)[0].decode(errors="replace")


def test_uploaded_code_runs_in_its_own_environment_built_from_its_requirements(
    server: tuple[Server, Client], tmp_path: Path
) -> None:
    s, ana = server
    src = tmp_path / "src"
    src.mkdir()
    (src / "requirements.txt").write_text("six==1.17.0\n")
    (src / "train.py").write_text(
        "import os, sys, six\n"
        "print('six', six.__version__)\n"
        "print(sys.executable)\n"
        f"print({str(Path(sys.executable).parent)!r} in os.environ['PATH'].split(':'))\n"
    )
    code = upload(ana, src, "vision")
    ana.submit(WorkloadCreate(project="vision", name="train", command=["python", "train.py"], code=code))
    s.wait_state("train", "succeeded", timeout=180)
    # uv's output first (the build is the member's work), then the job's: its environment's Python, not the server's.
    assert _log(ana, "train").splitlines()[-3:] == ["six 1.17.0", "/run/gpupool-env/bin/python", "False"]


def test_an_image_built_here_runs_with_its_allocations_gpus(server: tuple[Server, Client], image: str) -> None:
    s, ana = server
    # Something holds a GPU first, so the image's allocation is not simply the first devices.
    ana.submit(WorkloadCreate(project="vision", name="hold", gpus=1, command=["sleep", "600"]))
    s.wait_state("hold", "running", timeout=60)
    script = (
        "while [ ! -e go ]; do sleep 0.05; done; "  # until the test has read its allocation
        'echo "cuda=$CUDA_VISIBLE_DEVICES"; echo "nvidia=$NVIDIA_VISIBLE_DEVICES"; echo "w=$GPUPOOL_WORKLOAD"'
    )
    w = ana.submit(WorkloadCreate(project="vision", name="img", gpus=2, image=image, command=["sh", "-c", script]))
    running = s.wait_state("img", "running", timeout=60)
    held = [d["index"] for d in s.workload("hold")["allocations"][0]["devices"]]
    got = [d["index"] for d in running["allocations"][0]["devices"]]
    (s.data_dir / "workloads" / str(w.id) / "go").touch()
    s.wait_state("img", "succeeded", timeout=60)
    assert len(got) == 2 and not set(got) & set(held)
    assert _log(ana, "img").splitlines() == [
        "cuda=" + ",".join(str(i) for i in got),
        "nvidia=" + ",".join(f"FAKE-{i}" for i in got),
        "w=img",
    ]
    ana.cancel("hold")


def test_a_bad_requirement_fails_the_workload_with_uvs_reason(server: tuple[Server, Client], tmp_path: Path) -> None:
    s, ana = server
    src = tmp_path / "src"
    src.mkdir()
    (src / "requirements.txt").write_text("gpupool-no-such-package-xyz==0.0.1\n")
    (src / "train.py").write_text("print('never runs')\n")
    code = upload(ana, src, "vision")
    ana.submit(WorkloadCreate(project="vision", name="bad", command=["python", "train.py"], code=code))
    w = s.wait_state("bad", "failed", timeout=180)
    failed = w["events"][-1]
    assert (failed["code"], failed["args"]["member"], failed["args"]["exit_code"]) == ("failed", 0, 97)
    detail = failed["args"]["detail"]
    assert detail.startswith("its Python environment could not be built from requirements.txt (uv: ")
    assert "gpupool-no-such-package-xyz" in detail
    assert len(detail.encode()) <= 1024 and len(detail.splitlines()) <= 5
    assert f"gpupool: {detail}" in _log(ana, "bad")
    assert "never runs" not in _log(ana, "bad")
    assert failed["reason"] == f"member 0 exited with code 97: {detail}"  # what describe prints


def test_a_container_outlives_a_killed_server_is_adopted_and_stopped_with_its_grace(
    server: tuple[Server, Client], image: str
) -> None:
    s, ana = server
    script = "trap 'echo TERM; exit 0' TERM; echo up; while :; do sleep 0.1; done"
    w = ana.submit(
        WorkloadCreate(project="vision", name="long", gpus=1, image=image, command=["sh", "-c", script], grace_s=20)
    )
    s.wait_state("long", "running", timeout=60)
    wait_for(lambda: _log(ana, "long") == "up\n", 60, "the container to start")
    alloc = f"{w.id}-0-0"
    first = _containers(s, alloc)
    assert len(first) == 1
    s.kill()  # SIGKILL: no chance to clean up; the container runs on
    assert _containers(s, alloc) == first
    s.start()
    assert (s.workload("long")["state"], _containers(s, alloc)) == ("running", first)
    ana.cancel("long")
    # Well within its grace: the cancel reached the container (its TERM), not a kill at the grace's end.
    s.wait_state("long", "cancelled", timeout=15)
    # One start (a relaunch would print "up" again, or be refused its name), one container, the same one.
    assert _log(ana, "long") == "up\nTERM\n"
    wait_for(lambda: _containers(s, alloc) == [], 30, "its container to be removed")
