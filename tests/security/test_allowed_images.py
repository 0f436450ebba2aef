"""Images limited to what the admin allows (issue 33): a workload naming an image outside the server's
allowed_images patterns is refused at submit (422, saying which patterns), on every backend, through the real app;
a pattern matches the name as given or as Docker expands it."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from tests.api.inprocess import make_api


@pytest.mark.parametrize(
    ("image", "status"),
    [
        ("ghcr.io/acme/train:2", 201),
        ("python:3.12", 201),  # docker.io/library/python:3.12
        ("docker.io/library/python:3.11-slim", 201),
        ("ghcr.io/acme-evil/train:2", 422),
        ("python:2.7", 422),
        ("localhost/trainer:latest", 422),
    ],
)
def test_a_workload_names_only_an_image_the_admin_allows(tmp_path_factory: pytest.TempPathFactory, image: str,
                                                         status: int) -> None:  # fmt: skip
    api = make_api(tmp_path_factory.mktemp("images"), allowed_images=["ghcr.io/acme/*", "docker.io/library/python:3.*"])
    with TestClient(api.app) as client:
        admin = {"Authorization": f"Bearer {api.admin_token}"}
        assert client.post("/api/v1/projects", json={"name": "p1", "deserved_gpus": 1}, headers=admin).is_success
        body = {"project": "p1", "name": "job", "type": "batch", "command": ["true"], "image": image}
        r = client.post("/api/v1/workloads", json=body, headers=admin)
        assert r.status_code == status, r.text
        if status == 422:
            assert r.json()["detail"] == (
                f"image {image!r} is not one this server allows (its patterns: ghcr.io/acme/*, "
                "docker.io/library/python:3.*); ask an admin to allow it (allowed_images)"
            )
    api.close()
