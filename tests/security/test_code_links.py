"""Uploaded code never leads outside its tree (issue 33, item 6). The link check read link text only, so a link
through `d -> .` passed (`d/d/../..` is above the top once `d` is followed), and `requirements.txt -> /proc/kmsg`
was then read as root. Now every link of a manifest is resolved through the tree's other links, loops and long
chains refused, through the real API (422, saying why); a legitimate relative link is still taken and placed as a
link; placing a tree as root writes through no link even where the check is bypassed, reads only regular files
(a FIFO planted as a blob fails at once instead of hanging), and takes no lock another workload's launch needs."""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from gpupool.backends.local import workdirs
from gpupool.backends.local.workdirs import Blobs, CodePlacer, UnsafeTree
from gpupool.client.code import pack
from gpupool.models.code import CodeFile, CodeManifest
from gpupool.store.blobs import CHUNK_BYTES, BlobStore, blob_root, digest_of
from tests.api.inprocess import Api, make_api

DATA = b"step 3: loss 0.25\n"
CHUNK = digest_of(DATA)


class Member:
    """A member of project p1, calling the real app."""

    def __init__(self, http: TestClient, token: str) -> None:
        self.http, self.headers = http, {"Authorization": f"Bearer {token}"}

    def manifest(self, files: list[dict[str, Any]]) -> tuple[int, Any]:
        body = {"files": sorted(files, key=lambda f: f["path"])}
        r = self.http.put("/api/v1/code/manifests", params={"project": "p1"}, json=body, headers=self.headers)
        return r.status_code, r.json()


def _file(path: str) -> dict[str, Any]:
    return {"path": path, "mode": 0o644, "size": len(DATA), "sha256": hashlib.sha256(DATA).hexdigest(),
            "chunks": [CHUNK]}  # fmt: skip


def _link(path: str, target: str) -> dict[str, Any]:
    return {"path": path, "mode": 0o777, "link": target}


@pytest.fixture(scope="module")
def member(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, Member]]:
    api = make_api(tmp_path_factory.mktemp("code-links"))
    with TestClient(api.app) as http:
        admin = {"Authorization": f"Bearer {api.admin_token}"}
        assert http.post("/api/v1/departments", json={"name": "d1", "deserved_gpus": 2}, headers=admin).is_success
        project = {"name": "p1", "department": "d1", "deserved_gpus": 1}
        assert http.post("/api/v1/projects", json=project, headers=admin).is_success
        made = http.post("/api/v1/users", json={"name": "ana", "role": "member", "projects": ["p1"]}, headers=admin)
        ana = Member(http, made.json()["token"])
        sent = http.put(f"/api/v1/code/blobs/{CHUNK}", params={"project": "p1"}, content=DATA,
                        headers={**ana.headers, "Content-Type": "application/octet-stream"})  # fmt: skip
        assert sent.status_code == 204, sent.text
        yield api, ana
    api.close()


ESCAPES = {
    "through d -> . then up": (
        [_link("d", "."), _link("e", "d/d/../.."), _file("train.py")],
        "link 'e' points outside the tree: its target 'd/d/../..' leads above its top (through 'e' -> 'd' -> 'd')",
    ),
    "through d -> . as requirements.txt": (
        [_link("d", "."), _link("requirements.txt", "d/d/d/../../../../proc/kmsg")],
        "link 'requirements.txt' points outside the tree: its target 'd/d/d/../../../../proc/kmsg' leads above",
    ),
    "through a link to its parent, in a subdirectory": (
        [_link("lib/up", ".."), _link("lib/x", "up/lib/up/..")],
        "link 'lib/x' points outside the tree: its target 'up/lib/up/..' leads above its top",
    ),
    "a -> b, b -> a": ([_link("a", "b"), _link("b", "a")], "link 'a' is a loop of links ('a' -> 'b' -> 'a'"),
    "a link to itself, deeper each time": ([_link("a", "a/x")], "link 'a' passes through more than 40 links"),
    "/proc/kmsg": (
        [_link("requirements.txt", "/proc/kmsg")],
        "link 'requirements.txt' points outside the tree: its target '/proc/kmsg' is an absolute path",
    ),
    "an absolute link": (
        [_link("data", "/etc")],
        "link 'data' points outside the tree: its target '/etc' is an absolute path",
    ),
    "in-tree, through a link to an absolute path": (
        [_link("a", "b/passwd"), _link("b", "/etc")],
        "link 'a' points outside the tree: it passes through 'a' -> 'b', whose target '/etc' is absolute",
    ),
}


@pytest.mark.parametrize("case", ESCAPES)
def test_a_link_that_leads_outside_the_tree_or_loops_is_refused_saying_why(
    member: tuple[Api, Member], case: str
) -> None:
    files, reason = ESCAPES[case]
    status, body = member[1].manifest(files)
    assert status == 422, body
    assert reason in body["detail"], body


def test_an_in_tree_relative_link_is_taken_and_placed_as_a_link(member: tuple[Api, Member], tmp_path: Path) -> None:
    api, ana = member
    files = [_file("runs/3/log.txt"), _link("latest", "runs/3"), _link("d", "."), _link("log", "d/d/latest/log.txt"),
             _link("runs/best", "../latest")]  # fmt: skip
    status, stored = ana.manifest(files)
    assert status == 200, stored
    data = api.ctx.settings.data_dir
    workdir = data / "workloads" / "7"
    assert CodePlacer(data / "workloads", Blobs(data)).place(7, stored["code"], workdir, None)
    assert (os.readlink(workdir / "latest"), os.readlink(workdir / "runs" / "best")) == ("runs/3", "../latest")
    assert (workdir / "log").read_bytes() == (workdir / "latest" / "log.txt").read_bytes() == DATA
    assert (workdir / "runs" / "best" / "log.txt").resolve() == (workdir / "runs" / "3" / "log.txt").resolve()


def test_the_client_sends_no_link_the_server_would_refuse(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "runs" / "3").mkdir(parents=True)
    (src / "runs" / "3" / "log.txt").write_bytes(DATA)
    for name, target in (("d", "."), ("e", "d/d/../.."), ("latest", "runs/3"), ("a", "b"), ("b", "a")):
        (src / name).symlink_to(target)
    packed = pack(src, 2**20, CHUNK_BYTES)
    assert [(f.path, f.link) for f in packed.manifest.files] == [
        ("d", "."), ("latest", "runs/3"), ("runs/3/log.txt", None)
    ]  # fmt: skip
    assert packed.skipped == ["a", "b", "e"]


def _planted(data: Path, manifest: CodeManifest) -> str:
    """A manifest put straight into the blob area, as if the API's check had been bypassed."""
    body = manifest.canonical()
    BlobStore(blob_root(data)).put(digest_of(body), body)
    BlobStore(blob_root(data)).put(CHUNK, DATA)
    return digest_of(body)


def test_placing_refuses_a_tree_that_leaves_itself_and_writes_through_no_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, outside = tmp_path / "data", tmp_path / "outside"
    outside.mkdir()
    f = CodeFile(path="d/x", size=len(DATA), sha256=hashlib.sha256(DATA).hexdigest(), chunks=[CHUNK])
    code = _planted(data, CodeManifest(files=[CodeFile(path="d", mode=0o777, link=str(outside)), f]))
    placer = CodePlacer(data / "workloads", Blobs(data))
    with pytest.raises(UnsafeTree, match="cannot be placed: path 'd/x' is inside 'd'"):
        placer.place(1, code, data / "workloads" / "1", None)
    # With the check gone too, the writes themselves follow no link: `d` is not entered.
    monkeypatch.setattr(workdirs, "tree_problem", lambda manifest: None)
    with pytest.raises(OSError):
        placer.place(1, code, data / "workloads" / "1", None)
    assert list(outside.iterdir()) == [] and placer.placed(1) is None


def test_placing_reads_regular_files_only_and_waits_on_no_other_workloads_lock(tmp_path: Path) -> None:
    data = tmp_path / "data"
    f = CodeFile(path="train.py", size=len(DATA), sha256=hashlib.sha256(DATA).hexdigest(), chunks=[CHUNK])
    code = _planted(data, CodeManifest(files=[f]))
    placer = CodePlacer(data / "workloads", Blobs(data))
    blob = Blobs(data).path(CHUNK)
    blob.unlink()
    os.mkfifo(blob)  # read as it was, a FIFO blocks the reader forever
    errors: list[BaseException] = []

    def place() -> None:
        try:
            placer.place(2, code, data / "workloads" / "2", None)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=place, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive() and "is not a regular file" in str(errors[0])
    blob.unlink()
    BlobStore(blob_root(data)).put(CHUNK, DATA)
    assert workdirs.MAX_READ_BYTES >= CHUNK_BYTES
    # Workload 1's launch stuck inside its placement (holding its lock): workload 2's goes ahead.
    (data / "workloads").mkdir(exist_ok=True)
    held = os.open(data / "workloads" / "1.code.lock", os.O_RDONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        t = threading.Thread(target=place, daemon=True)
        t.start()
        t.join(10)
        assert not t.is_alive() and len(errors) == 1
        assert (data / "workloads" / "2" / "train.py").read_bytes() == DATA
    finally:
        os.close(held)
