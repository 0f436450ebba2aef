"""Workload lists paged oldest first by `after` (keyset: each page starts after the last id of the one before),
beside the newest-first `cursor`, on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.routers.factories import Factory

pytestmark = pytest.mark.anyio


async def _walk(http: httpx.AsyncClient, make: Factory, **params: Any) -> tuple[list[int], list[str | None]]:
    seen: list[int] = []
    nexts: list[str | None] = []
    query: dict[str, Any] = {"limit": 2, **params}
    while True:
        page = (await http.get("/api/v1/workloads", params=query, headers=make.admin.auth)).json()
        seen += [w["id"] for w in page["items"]]
        nexts.append(page["next_cursor"])
        if page["next_cursor"] is None:
            return seen, nexts
        query["after"] = page["next_cursor"]


async def test_the_list_pages_oldest_first_after_an_id(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    ids = [(await make.workload(proj))["id"] for _ in range(5)]
    assert await _walk(http, make, project=proj, after=0) == (ids, [str(ids[1]), str(ids[3]), None])
    assert await _walk(http, make, project=proj, after=ids[2]) == (ids[3:], [None])


async def test_paging_after_an_id_keeps_to_a_state(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    ids = [(await make.workload(proj))["id"] for _ in range(5)]
    for wid in ids[1::2]:
        await make.ok("POST", f"/api/v1/workloads/{wid}/cancel")
    assert await _walk(http, make, project=proj, state="pending", after=0) == (ids[::2], [str(ids[2]), None])


async def test_a_workload_submitted_while_paging_comes_on_the_last_page(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    ids = [(await make.workload(proj))["id"] for _ in range(2)]
    first = await make.ok("GET", "/api/v1/workloads", project=proj, limit=2, after=0)
    late = (await make.workload(proj))["id"]
    rest = await make.ok("GET", "/api/v1/workloads", project=proj, limit=2, after=ids[-1])
    assert ([w["id"] for w in first["items"]], [w["id"] for w in rest["items"]]) == (ids, [late])


async def test_after_and_cursor_together_are_refused(http: httpx.AsyncClient, make: Factory) -> None:
    r = await http.get("/api/v1/workloads", params={"after": 1, "cursor": "9"}, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (
        422,
        {"detail": "cursor pages newest first and after oldest first: give one of them"},
    )


@pytest.mark.parametrize(
    ("after", "kind"), [("-1", "greater_than_equal"), ("2147483648", "less_than_equal"), ("x", "int_parsing")]
)
async def test_an_after_that_is_no_id_is_422(http: httpx.AsyncClient, make: Factory, after: str, kind: str) -> None:
    r = await http.get("/api/v1/workloads", params={"after": after}, headers=make.admin.auth)
    assert (r.status_code, [(e["loc"], e["type"]) for e in r.json()["detail"]]) == (422, [(["query", "after"], kind)])
