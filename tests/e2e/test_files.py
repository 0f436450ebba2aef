"""`gpupool cp` of a workload's files against a real server, both ways, running and finished; a tenant's planted
symlinks never make the (root) server read or write outside the working directory; viewers read, other tenants
see nothing."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from gpupool.client import Client
from gpupool.client import volumes as api
from gpupool.client.client import ApiError
from gpupool.models.accounts import UserCreate
from gpupool.models.schemas import WorkloadCreate
from tests.e2e.conftest import Server, wait_for

# cp finds the workload, its member and its retention in the store (both kinds); the symlink test is the disk's.
SQLITE_ONLY = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def _user(server: Server, name: str, project: str, role: str = "member") -> Client:
    return server.client(server.client().create_user(UserCreate(name=name, projects=[project], role=role)).token)


def _tar(name: str, data: bytes, kind: bytes = tarfile.REGTYPE, link: str = "") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:") as tar:
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.size = kind, link, len(data) if kind == tarfile.REGTYPE else 0
        tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return buf.getvalue()


def test_cp_both_ways_running_and_finished(org_server: Server, tmp_path: Path) -> None:
    s = org_server
    ana, vic, bo = _user(s, "ana", "vision"), _user(s, "vic", "vision", "viewer"), _user(s, "bo", "nlp")
    script = "mkdir -p out && echo result > out/metrics.txt && while [ ! -f go ]; do sleep 0.1; done; cat go"
    ana.submit(WorkloadCreate(project="vision", name="job", type="batch", command=["/bin/sh", "-c", script]))
    s.wait_state("job", "running", timeout=60)
    wait_for(lambda: any(e.path == "out" for e in api.list_files(ana, "job")), 30, "out/ to appear")

    # Running: read out a directory as a tar, through the CLI; write a file in through the CLI.
    token = s.client().create_user(UserCreate(name="cli", projects=["vision"])).token
    s.cli("cp", "job:out", str(tmp_path / "got"), token=token)
    assert (tmp_path / "got" / "metrics.txt").read_text() == "result\n"
    (tmp_path / "go").write_text("from outside\n")
    s.cli("cp", str(tmp_path / "go"), "job:go", token=token)
    assert s.wait_state("job", "succeeded", "failed", timeout=60)["state"] == "succeeded"
    assert s.cli("logs", "job").stdout == "from outside\n"

    # Finished: still there, both ways; a viewer reads, cannot write; another tenant does not see it.
    s.cli("cp", "job:out/metrics.txt", str(tmp_path / "m.txt"), token=token)
    assert (tmp_path / "m.txt").read_text() == "result\n"
    assert api.put_files(ana, "job", "late", _tar("note.txt", b"after")).files == 1
    assert api.get_files(vic, "job", "late/note.txt") == (b"after", False)
    entries = {(e.path, e.kind, e.size) for e in api.list_files(vic, "job", "out")}
    assert entries == {("out/metrics.txt", "file", 7)}
    with pytest.raises(ApiError) as denied:
        api.put_files(vic, "job", "", _tar("x", b"x"))
    assert denied.value.status == 403
    with pytest.raises(ApiError) as hidden:
        api.get_files(bo, "job", "out/metrics.txt")
    assert hidden.value.status == 404


@SQLITE_ONLY
def test_planted_symlinks_never_leak_outside_the_workdir(org_server: Server, tmp_path: Path) -> None:
    s = org_server
    ana = _user(s, "ana", "vision")
    secret = tmp_path / "secret.txt"
    secret.write_text("server's own\n")
    victim = tmp_path / "victim"
    victim.mkdir()
    script = f"ln -s {secret} leak && ln -s {victim} escape && ln -s / root && echo planted"
    ana.submit(WorkloadCreate(project="vision", name="evil", type="batch", command=["/bin/sh", "-c", script]))
    assert s.wait_state("evil", "succeeded", "failed", timeout=60)["state"] == "succeeded"

    with pytest.raises(ApiError) as leak:
        api.get_files(ana, "evil", "leak")
    assert leak.value.status == 422 and "link" in leak.value.reason
    with pytest.raises(ApiError) as through:
        api.get_files(ana, "evil", "root/etc/passwd")
    assert through.value.status == 422
    # The whole directory as a tar: the links are links, never what they point at.
    data, is_tar = api.get_files(ana, "evil", "")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        links = {m.name: (m.issym(), m.linkname) for m in tar if m.name in ("leak", "escape", "root")}
    assert is_tar and links == {"leak": (True, str(secret)), "escape": (True, str(victim)), "root": (True, "/")}
    # Writing through a planted link (as a directory on the way, or as the file itself) is refused.
    for path, name in (("escape", "x.txt"), ("", "leak")):
        with pytest.raises(ApiError) as write:
            api.put_files(ana, "evil", path, _tar(name, b"owned"))
        assert write.value.status == 422, (path, name)
    assert secret.read_text() == "server's own\n" and list(victim.iterdir()) == []
    # A tar that climbs out, or carries a link, is refused.
    for bad in (_tar("../up.txt", b"x"), _tar("ln", b"", tarfile.SYMTYPE, "/etc/passwd")):
        with pytest.raises(ApiError) as refused:
            api.put_files(ana, "evil", "", bad)
        assert refused.value.status == 422
    assert not (s.data_dir / "workloads" / "up.txt").exists()
