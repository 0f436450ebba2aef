"""The pools router: every pool a node names, and the one setting an admin may change (whether fractions of
different projects may share a device)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.api.inprocess import Api
from tests.api.routers.factories import Factory, client

pytestmark = pytest.mark.anyio


async def test_a_pool_is_listed_with_its_hardware_and_keeps_its_setting_until_changed(
    fresh_api: Callable[..., Api],
) -> None:
    api = fresh_api(gpus="fake:2xH100-80GB")
    async with client(api) as http:
        make = Factory(api, http)
        r = await http.get("/api/v1/pools", headers=make.admin.auth)
        default = {"name": "default", "nodes": 1, "gpus": 2, "share_across_projects": False, "updated_at": None}
        assert (r.status_code, r.json()) == (200, [default])
        r = await http.patch("/api/v1/pools/default", json={"share_across_projects": True}, headers=make.admin.auth)
        changed = r.json()
        assert (r.status_code, {**changed, "updated_at": None}) == (200, {**default, "share_across_projects": True})
        assert changed["updated_at"] is not None
        r = await http.patch("/api/v1/pools/default", json={}, headers=make.admin.auth)
        assert (r.status_code, r.json()) == (200, changed)  # nothing named, nothing changed
        member = await make.user()
        assert (await http.get("/api/v1/pools", headers=member.auth)).json() == [changed]


async def test_a_pool_no_node_names_is_404(http: httpx.AsyncClient, make: Factory) -> None:
    r = await http.patch("/api/v1/pools/a100", json={"share_across_projects": True}, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (404, {"detail": "no pool 'a100': no node names it"})
    assert [p["name"] for p in (await http.get("/api/v1/pools", headers=make.admin.auth)).json()] == ["default"]


@pytest.mark.parametrize(
    ("body", "kind"),
    [({"share_across_projects": "yes"}, "bool_type"), ({"share_across_projects": 1}, "bool_type"),
     ({"shared": True}, "extra_forbidden")],
)  # fmt: skip
async def test_a_pool_setting_is_a_strict_boolean(
    http: httpx.AsyncClient, make: Factory, body: dict[str, object], kind: str
) -> None:
    r = await http.patch("/api/v1/pools/default", json=body, headers=make.admin.auth)
    assert (r.status_code, [e["type"] for e in r.json()["detail"]]) == (422, [kind])
