"""The API's own documentation page, served with nothing from outside: Swagger UI's files come from the
fastapi-offline package (PyPI), and the page has no inline script, so the strict CSP holds and it works offline."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, RedirectResponse

router = APIRouter(include_in_schema=False)

_spec = find_spec("fastapi_offline")
ASSETS = Path(_spec.origin).parent / "static" if _spec and _spec.origin else Path(__file__).parent / "missing"
"""swagger-ui-bundle.js and swagger-ui.css, as the package ships them."""

_HEAD = '<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>gpupool API</title>'


@router.get("/docs")
def swagger_ui() -> HTMLResponse:
    return HTMLResponse(
        f'{_HEAD}<link rel="stylesheet" href="/docs-assets/swagger-ui.css"></head>\n'
        '<body><div id="swagger-ui"></div>\n<script src="/docs-assets/swagger-ui-bundle.js"></script>\n'
        '<script src="/portal/docs.js"></script></body></html>\n'
    )


@router.get("/redoc")
def redoc() -> RedirectResponse:
    """One documentation page: ReDoc needs a blob worker and its vendor's logo from the network, which the
    strict CSP refuses."""
    return RedirectResponse("/docs")
