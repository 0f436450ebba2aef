"""Project volumes against a real server: a volume written by one job is read by the next (in an image too, through
podman), its size is enforced by the kernel (a loop-mounted filesystem: a write past it fails with ENOSPC inside
the job), it is refused deletion while a workload mounts it, and other tenants never see it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.client import Client
from gpupool.client import volumes as api
from gpupool.client.client import ApiError
from gpupool.models.accounts import UserCreate
from gpupool.models.schemas import WorkloadCreate
from gpupool.models.volumes import VolumeMount
from tests.backends.test_environments import build_image
from tests.e2e.conftest import Server

# Volume rows and the mounts kept in a workload's spec are read on both stores; the image test is podman's.
SQLITE_ONLY = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
IMAGE = "localhost/gpupool-e2e-volumes-busybox:1"


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_image(tmp_path_factory.mktemp("image"), IMAGE)


def _user(server: Server, name: str, project: str, role: str = "member") -> Client:
    return server.client(server.client().create_user(UserCreate(name=name, projects=[project], role=role)).token)


def _job(c: Client, name: str, script: str, mount: str = "/data", image: str | None = None,
         read_only: bool = False) -> WorkloadCreate:  # fmt: skip
    return WorkloadCreate(project="vision", name=name, type="batch", command=["/bin/sh", "-c", script], image=image,
                          volumes=[VolumeMount(name="scratch", path=mount, read_only=read_only)])  # fmt: skip


def test_a_volume_outlives_its_writer_and_its_size_is_enforced(org_server: Server, tmp_path: Path) -> None:
    s = org_server
    ana, bo, vic = _user(s, "ana", "vision"), _user(s, "bo", "nlp"), _user(s, "vic", "vision", "viewer")
    token = s.client().create_user(UserCreate(name="cli", projects=["vision"])).token
    made = s.cli("volume", "create", "scratch", "--size", "16MiB", "-p", "vision", token=token)
    assert made.stdout == "volume scratch of vision created (16MiB)\n"
    listed = s.json("volume", "list", "-p", "vision", token=token)
    assert [(v["name"], v["size_bytes"], v["created_by"]) for v in listed] == [("scratch", 16 * 2**20, "cli")]
    ana.submit(_job(ana, "writer", "echo hello > /data/greeting && stat -c %a /data"))
    done = s.wait_state("writer", "succeeded", "failed", timeout=60)
    assert done["state"] == "succeeded", s.cli("logs", "writer").stdout
    # The reader comes from apply's YAML, mounting the volume read-only.
    spec = tmp_path / "reader.yaml"
    spec.write_text("project: vision\nname: reader\ncommand: [/bin/sh, -c, cat /data/greeting]\n"
                    "volumes:\n  - {name: scratch, path: /data, read_only: true}\n")  # fmt: skip
    s.cli("apply", "-f", str(spec), "--no-code", token=token)
    assert s.wait_state("reader", "succeeded", "failed", timeout=60)["state"] == "succeeded"
    assert s.workload("reader")["volumes"] == [{"name": "scratch", "path": "/data", "read_only": True}]
    assert s.cli("logs", "reader").stdout == "hello\n"
    assert s.cli("logs", "writer").stdout == "700\n"

    # Past its size: the kernel refuses the write, inside the job.
    ana.submit(_job(ana, "filler", "dd if=/dev/zero of=/data/big bs=1M count=64 2>&1; echo rc=$?"))
    assert s.wait_state("filler", "succeeded", "failed", timeout=60)["state"] == "succeeded"
    out = s.cli("logs", "filler").stdout
    assert "No space left on device" in out and out.strip().endswith("rc=1"), out

    # In use: deletion refused; other tenants see nothing; viewers list but cannot write.
    ana.submit(_job(ana, "holder", "sleep 60"))
    s.wait_state("holder", "running", timeout=60)
    with pytest.raises(ApiError) as busy:
        api.delete_volume(ana, "vision", "scratch")
    assert busy.value.status == 409 and "holder" in busy.value.reason
    assert [v.in_use_by for v in api.list_volumes(vic, "vision")] == [["holder"]]
    with pytest.raises(ApiError) as denied:
        api.create_volume(vic, "vision", "other", "16MiB")
    assert denied.value.status == 403
    with pytest.raises(ApiError) as hidden:
        api.list_volumes(bo, "vision")
    assert hidden.value.status == 404
    with pytest.raises(ApiError) as hidden_delete:
        api.delete_volume(bo, "vision", "scratch")
    assert hidden_delete.value.status == 404
    s.cli("cancel", "holder")
    s.wait_state("holder", "cancelled", timeout=60)
    api.delete_volume(ana, "vision", "scratch")
    assert not (s.data_dir / "volumes" / "vision" / "scratch.img").exists()
    assert api.list_volumes(ana, "vision") == []


def test_submit_refuses_an_unknown_volume_and_a_bad_path(org_server: Server) -> None:
    ana = _user(org_server, "ana", "vision")
    with pytest.raises(ApiError) as unknown:
        ana.submit(_job(ana, "j", "true"))
    assert (unknown.value.status, "volume 'scratch' not found in project 'vision'" in unknown.value.reason) == (
        422,
        True,
    )
    api.create_volume(ana, "vision", "scratch", "16MiB")
    for path, why in (("/proc/x", "/proc belongs to the system"), ("/workspace", "working directory"),
                      ("/data/../etc", "normalised")):  # fmt: skip
        with pytest.raises(ApiError) as bad:
            ana.submit(_job(ana, "j", "true", path))
        assert bad.value.status == 422 and why in bad.value.reason, bad.value.reason
    body = _job(ana, "j", "true").model_dump(mode="json") | {"volumes": [{"name": "scratch", "path": "data"}]}
    relative = ana._call("POST", "/api/v1/workloads", json=body, accept=(422,))
    assert relative.status_code == 422 and "volumes" in relative.text


@SQLITE_ONLY
def test_an_image_job_mounts_the_volume_a_plain_job_wrote(org_server: Server, image: str) -> None:
    s = org_server
    ana = _user(s, "ana", "vision")
    api.create_volume(ana, "vision", "scratch", "16MiB")
    ana.submit(_job(ana, "plain", "echo from-plain > /data/note"))
    assert s.wait_state("plain", "succeeded", "failed", timeout=60)["state"] == "succeeded"
    ana.submit(_job(ana, "imaged", "cat /data/note && echo from-image > /data/back && id -u", image=image))
    assert s.wait_state("imaged", "succeeded", "failed", timeout=60)["state"] == "succeeded", s.cli("logs", "imaged")
    # The container runs as the project's identity, the one that owns the volume (700) on the host.
    owner = (s.data_dir / "volumes" / "vision" / "scratch").stat().st_uid
    assert s.cli("logs", "imaged").stdout == f"from-plain\n{owner}\n"
    ana.submit(_job(ana, "ro", "cat /data/back; touch /data/x 2>&1; echo rc=$?", image=image, read_only=True))
    assert s.wait_state("ro", "succeeded", "failed", timeout=60)["state"] == "succeeded"
    assert s.cli("logs", "ro").stdout == "from-image\ntouch: /data/x: Read-only file system\nrc=1\n"
    api.delete_volume(ana, "vision", "scratch")  # unmounted: nothing outlives the test
