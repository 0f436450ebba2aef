"""A client of this release reads the answers of a newer server, which carry fields it does not know."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from gpupool.client import Client
from gpupool.models.access import TokenCreate
from gpupool.models.schemas import ProjectCreate, WorkloadCreate
from tests.api.inprocess import make_api

MAPS = frozenset({"env", "isolation", "own", "idle_timeout_s", "max_runtime_s", "source"})
"""Fields whose values are maps of the user's keys, not objects of the API: a newer server adds nothing there."""


def _grow(value: Any) -> Any:
    """Every object in an answer gains a field from the future."""
    if isinstance(value, dict):
        grown = {k: v if k in MAPS else _grow(v) for k, v in value.items()}
        return {**grown, "added_in_a_later_release": {"nested": [1, 2]}}
    if isinstance(value, list):
        return [_grow(v) for v in value]
    return value


def test_answers_with_fields_a_client_does_not_know_are_read(tmp_path: Any) -> None:
    api = make_api(tmp_path)
    with TestClient(api.app) as server:

        def newer_server(request: httpx.Request) -> httpx.Response:
            real = server.request(request.method, request.url.path, params=request.url.params,
                                  content=request.content, headers=dict(request.headers))  # fmt: skip
            body = real.content
            if real.headers.get("content-type", "").startswith("application/json"):
                body = json.dumps(_grow(real.json())).encode()
            kind = {"content-type": real.headers["content-type"]}
            return httpx.Response(real.status_code, content=body, headers=kind)

        with Client("http://testserver", api.admin_token, transport=httpx.MockTransport(newer_server)) as c:
            assert c.whoami().name == "admin"
            assert c.create_project(ProjectCreate(name="lab", deserved_gpus=1)).name == "lab"
            assert c.submit(WorkloadCreate(project="lab", name="job", command=["true"])).name == "job"
            assert [w.name for w in c.list_workloads()] == ["job"]
            detail = c.describe("job")
            assert detail.events[0].state == "pending"
            assert "added_in_a_later_release" not in detail.model_dump()
            assert c.create_token(TokenCreate(name="t")).token.startswith("gp_")
            assert [n.name for n in c.nodes()] == [api.ctx.backend.inventory()[0].name]


def test_what_a_client_sends_still_refuses_unknown_fields() -> None:
    with pytest.raises(ValueError, match="extra"):
        WorkloadCreate.model_validate({"project": "lab", "command": ["true"], "priority_boost": 9})
