"""Code goes with the job, against a real server process: a directory uploaded through gpupool.client.code (what
`submit --workdir` runs) honours .gitignore and .gpupoolignore, a resubmit sends only the chunk that changed, a
workload names it and describe says so, a tree over the limit is refused naming its largest files, and only the
project's readers (or the workload's own code token, as a Kubernetes init step presents it) read it back."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from gpupool.client import Client
from gpupool.client.client import ApiError
from gpupool.client.code import CodeError, fetch, pack, upload, upload_tree
from gpupool.models.accounts import UserCreate
from gpupool.models.code import CodeFile, CodeManifest
from gpupool.models.schemas import WorkloadCreate
from gpupool.services import code as code_service
from gpupool.store.tables import WorkloadRow
from tests.e2e.conftest import Server

TRAIN = "import pathlib\nrows = pathlib.Path('data.csv').read_text().splitlines()\nprint(len(rows))\n"


def _tree(root: Path) -> Path:
    root.mkdir()
    (root / "train.py").write_text(TRAIN)
    (root / "data.csv").write_text("a,b\n1,2\n")
    (root / ".gitignore").write_text("*.log\nout/\n")
    (root / ".gpupoolignore").write_text("big.bin\n!keep.log\n")
    (root / "run.log").write_text("ignored by git\n")
    (root / "keep.log").write_text("git ignores it, .gpupoolignore sends it\n")
    (root / "big.bin").write_bytes(b"\0" * 4096)
    (root / "out").mkdir()
    (root / "out" / "model.pt").write_bytes(b"weights")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core]\n")
    return root


def _member(server: Server, name: str, project: str) -> Client:
    token = server.client().create_user(UserCreate(name=name, projects=[project])).token
    return server.client(token)


def _store(server: Server) -> Session:
    return Session(create_engine(server.db_url or f"sqlite:///{server.data_dir / 'gpupool.db'}"))


def test_code_is_sent_once_named_by_a_workload_and_read_only_by_its_project(org_server: Server, tmp_path: Path) -> None:
    s = org_server
    ana, bo = _member(s, "ana", "vision"), _member(s, "bo", "nlp")
    src = _tree(tmp_path / "src")
    first = upload_tree(ana, src, "vision")
    sent = [".gitignore", ".gpupoolignore", "data.csv", "keep.log", "train.py"]
    assert (first.files, first.blobs_sent, first.bytes_sent) == (5, 5, sum((src / p).stat().st_size for p in sent))
    # Unchanged: nothing travels. One file changed: its one chunk, nothing else.
    assert (upload_tree(ana, src, "vision").blobs_sent, upload(ana, src, "vision")) == (0, first.code)
    (src / "data.csv").write_text("a,b\n1,2\n3,4\n")
    second = upload_tree(ana, src, "vision")
    assert (second.blobs_sent, second.bytes_sent) == (1, len("a,b\n1,2\n3,4\n"))
    assert second.code != first.code

    w = ana.submit(WorkloadCreate(project="vision", name="train", command=["python3", "train.py"], code=second.code))
    d = ana.describe("train")
    assert (d.code, d.code_files, d.code_bytes) == (second.code, 5, second.size)
    assert [f.path for f in ana.workload_code("train").files] == sent

    with pytest.raises(ApiError) as unknown:
        ana.submit(WorkloadCreate(project="vision", name="nope", command=["true"], code="sha256:" + "0" * 64))
    assert unknown.value.status == 422 and "is not a code tree project 'vision' uploaded" in unknown.value.reason
    # A tree only another project uploaded is not one vision may name.
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "serve.py").write_text("print('nlp')\n")
    with pytest.raises(ApiError) as theirs:
        ana.submit(
            WorkloadCreate(project="vision", name="nope", command=["true"], code=upload(bo, tmp_path / "theirs", "nlp"))
        )
    assert theirs.value.status == 422

    # Another project's member: not found, whichever way it asks; and what vision sent is not known to nlp.
    chunk = ana.workload_code("train").files[2].chunks[0]
    for call in (lambda: bo.workload_code(str(w.id)), lambda: bo.workload_code_blob(str(w.id), chunk),
                 lambda: bo.code_missing("vision", [chunk])):  # fmt: skip
        with pytest.raises(ApiError) as hidden:
            call()
        assert hidden.value.status == 404
    assert bo.code_missing("nlp", [chunk]) == [chunk]  # vision sent it; nlp must send it to use it
    assert ana.workload_code_blob("train", chunk) == b"a,b\n1,2\n3,4\n"


def test_a_workloads_code_token_reads_its_code_and_nothing_else(org_server: Server, tmp_path: Path) -> None:
    s = org_server
    ana = _member(s, "ana", "vision")
    src = _tree(tmp_path / "src")
    one = ana.submit(WorkloadCreate(project="vision", name="one", command=["true"], code=upload(ana, src, "vision")))
    (src / "train.py").write_text("print('two')\n")
    two = ana.submit(WorkloadCreate(project="vision", name="two", command=["true"], code=upload(ana, src, "vision")))
    with _store(s) as session:
        row = session.get(WorkloadRow, one.id)
        assert row is not None
        token = code_service.mint_token(session, row)
    with Client(s.url, token) as init_step:
        got = fetch(init_step, str(one.id), tmp_path / "fetched")
        assert [f.path for f in got.files] == [".gitignore", ".gpupoolignore", "data.csv", "keep.log", "train.py"]
        assert (tmp_path / "fetched" / "train.py").read_text() == TRAIN
        with pytest.raises(ApiError) as other:
            init_step.workload_code(str(two.id))
        assert other.value.status == 404
        with pytest.raises(ApiError) as api:
            init_step.list_workloads()
        assert api.value.status == 401
    forged = token[:-4] + ("0000" if not token.endswith("0000") else "1111")
    assert (
        httpx.get(f"{s.url}/api/v1/workloads/{one.id}/code", headers={"Authorization": f"Bearer {forged}"}).status_code
        == 401
    )


# Refused before anything is stored (the client's count, the server's check of a manifest): SQLite only. The store's
# code paths (manifests, blobs, collection) run on both stores in the tests above and below.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_tree_over_the_limit_is_refused_naming_its_largest_files(org_server: Server, tmp_path: Path) -> None:
    s = org_server
    ana = _member(s, "ana", "vision")
    src = _tree(tmp_path / "src")
    with open(src / "dataset.bin", "wb") as f:  # sparse: its size is what counts, and nothing is read
        f.truncate(101 * 2**20)
    with pytest.raises(CodeError) as client_side:
        upload(ana, src, "vision")
    assert client_side.value.status == 413
    assert client_side.value.reason == (
        f"{src} holds 101.0 MiB to send, over the server's limit of 100.0 MiB; the largest files: dataset.bin "
        f"(101.0 MiB), train.py ({len(TRAIN)} B), keep.log (40 B), .gpupoolignore (18 B), .gitignore (11 B). List "
        f"what the job need not carry in {src / '.gpupoolignore'}"
    )
    # The server holds to it whatever a client says: a manifest over the limit is refused before its chunks.
    big = CodeManifest(files=[CodeFile(path="dataset.bin", size=101 * 2**20, sha256="0" * 64, chunks=[])])
    with pytest.raises(ApiError) as server_side:
        ana.put_code_manifest("vision", big)
    assert server_side.value.status == 413
    assert server_side.value.reason == (
        "the code is 101.0 MiB, over this server's limit of 100.0 MiB; the largest files: dataset.bin (101.0 MiB) "
        "(list what it need not carry in .gpupoolignore)"
    )
    os.unlink(src / "dataset.bin")


def test_collection_forgets_only_what_no_workload_names(org_server: Server, tmp_path: Path) -> None:
    s = org_server
    ana = _member(s, "ana", "vision")
    kept = _tree(tmp_path / "kept")
    ana.submit(WorkloadCreate(project="vision", name="keep", command=["true"], code=upload(ana, kept, "vision")))
    dropped = tmp_path / "dropped"
    dropped.mkdir()
    (dropped / "only-here.py").write_text("print('never submitted')\n")
    upload(ana, dropped, "vision")
    with pytest.raises(ApiError) as member:
        ana.collect_code(0)
    assert member.value.status == 403
    manifest = pack(dropped, 2**20, 2**20).manifest.canonical()
    assert s.client().collect_code(0) == {"manifests": 1, "blobs": 2, "bytes": 25 + len(manifest)}
    assert upload_tree(ana, kept, "vision").blobs_sent == 0  # named by a workload: nothing was collected
    assert upload_tree(ana, dropped, "vision").blobs_sent == 1
    assert ana.describe("keep").code_files == 5


# The backend's copy of the tree, whatever the store that named it.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_job_runs_in_a_copy_of_its_code(org_server: Server, tmp_path: Path) -> None:
    s = org_server
    ana = _member(s, "ana", "vision")
    src = _tree(tmp_path / "src")
    (src / "train.py").write_text(
        "import pathlib\nrows = pathlib.Path('data.csv').read_text().splitlines()\n"
        "pathlib.Path('result.txt').write_text(f'{len(rows)} rows\\n')\n"
    )
    w = ana.submit(WorkloadCreate(project="vision", name="train", command=["python3", "train.py"],
                                  code=upload(ana, src, "vision")))  # fmt: skip
    s.wait_state("train", "succeeded", timeout=60)
    workdir = s.data_dir / "workloads" / str(w.id)
    assert (workdir / "result.txt").read_text() == "2 rows\n"
    assert sorted(p.name for p in workdir.iterdir() if not p.name.startswith(".")) == [
        "data.csv",
        "keep.log",
        "result.txt",
        "train.py",
    ]
