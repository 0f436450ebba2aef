"""One project cannot fill the store's disk with uploads (issue 33, item 8): what a project keeps uploaded is
counted against its code quota (code_quota_mib), and an upload past it gets 413 saying why, while other projects
and what the project holds already go on, through the real app."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from gpupool.store.blobs import CHUNK_BYTES, digest_of
from tests.api.inprocess import make_api

FULL = b"x" * CHUNK_BYTES  # 1 MiB: all of a 1 MiB quota
MORE = b"one byte too many"


@pytest.fixture
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, dict[str, dict[str, str]]]]:
    api = make_api(tmp_path_factory.mktemp("code-quota"), code_quota_mib=1)
    with TestClient(api.app) as http:
        admin = {"Authorization": f"Bearer {api.admin_token}"}
        tokens = {}
        for project, user in (("p1", "ana"), ("p2", "bob")):
            assert http.post("/api/v1/projects", json={"name": project, "deserved_gpus": 1}, headers=admin).is_success
            made = http.post("/api/v1/users", json={"name": user, "role": "member", "projects": [project]},
                             headers=admin)  # fmt: skip
            tokens[project] = {"Authorization": f"Bearer {made.json()['token']}",
                               "Content-Type": "application/octet-stream"}  # fmt: skip
        yield http, tokens
    api.close()


def _put(http: TestClient, headers: dict[str, str], project: str, data: bytes) -> tuple[int, str]:
    r = http.put(f"/api/v1/code/blobs/{digest_of(data)}", params={"project": project}, content=data, headers=headers)
    return r.status_code, r.text if r.status_code == 204 else r.json()["detail"]


def test_an_upload_past_the_projects_code_quota_is_refused_saying_why(
    http: tuple[TestClient, dict[str, dict[str, str]]],
) -> None:
    client, tokens = http
    assert _put(client, tokens["p1"], "p1", FULL) == (204, "")
    assert _put(client, tokens["p1"], "p1", MORE) == (
        413,
        "project 'p1' holds 1.0 MiB of code, and may hold 1.0 MiB: uploads no workload names are collected 24 hours "
        "after they were sent (an admin sets the quota: code_quota_mib)",
    )
    assert _put(client, tokens["p1"], "p1", FULL) == (204, "")  # what it holds already is no more
    assert _put(client, tokens["p2"], "p2", MORE) == (204, "")  # another project's quota is its own



def test_manifests_count_against_the_quota_too(http: tuple[TestClient, dict[str, dict[str, str]]]) -> None:
    client, tokens = http
    assert _put(client, tokens["p1"], "p1", FULL[: CHUNK_BYTES - 8000]) == (204, "")  # 8,000 bytes left
    empty = hashlib.sha256(b"").hexdigest()

    def manifest(n: int) -> tuple[int, object]:
        files = [{"path": f"d{n}/f{i:05d}", "mode": 0o644, "size": 0, "sha256": empty, "chunks": []} for i in range(40)]
        r = client.put("/api/v1/code/manifests", params={"project": "p1"}, json={"files": files},
                       headers={"Authorization": tokens["p1"]["Authorization"]})  # fmt: skip
        return r.status_code, r.json().get("detail")

    assert manifest(0)[0] == 200  # 5,663 bytes of manifest: within what is left
    status, detail = manifest(1)
    assert (status, str(detail).split(":")[0]) == (413, "project 'p1' holds 1021.7 KiB of code, and may hold 1.0 MiB")
