"""The docs router: Swagger UI served from the package's own files under the strict content security policy (no
inline script, nothing from elsewhere), ReDoc's address leading there, and the OpenAPI document itself."""

from __future__ import annotations

import re

import httpx
import pytest

pytestmark = pytest.mark.anyio


async def test_the_docs_page_loads_only_its_own_scripts(http: httpx.AsyncClient) -> None:
    r = await http.get("/docs")
    assert (r.status_code, r.headers["content-type"]) == (200, "text/html; charset=utf-8")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", r.text, re.S)
    assert scripts == [(' src="/docs-assets/swagger-ui-bundle.js"', ""), (' src="/portal/docs.js"', "")]
    for path in ("/docs-assets/swagger-ui-bundle.js", "/docs-assets/swagger-ui.css", "/portal/docs.js"):
        assert (await http.get(path)).status_code == 200, path


async def test_redoc_leads_to_the_one_docs_page(http: httpx.AsyncClient) -> None:
    r = await http.get("/redoc")
    assert (r.status_code, r.headers["location"]) == (307, "/docs")


async def test_the_openapi_document_names_every_operation_once(http: httpx.AsyncClient) -> None:
    r = await http.get("/openapi.json")
    spec = r.json()
    assert (r.status_code, spec["info"]["title"]) == (200, "gpupool")
    ids = [op["operationId"] for ops in spec["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids)) and "submit_workload" in ids
    assert not [p for p in spec["paths"] if p.startswith(("/apps", "/docs", "/redoc"))]  # not part of the API
