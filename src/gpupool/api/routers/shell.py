"""Routes of the shell API (issue 18); filled in by its owner."""

from __future__ import annotations

from fastapi import APIRouter

from gpupool.api.errors import ERRORS

router = APIRouter(tags=["shell"], responses=ERRORS)
