"""Routes of the volumes API (issue 18); filled in by its owner."""

from __future__ import annotations

from fastapi import APIRouter

from gpupool.api.errors import ERRORS

router = APIRouter(tags=["volumes"], responses=ERRORS)
