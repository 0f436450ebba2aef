"""The right-sizing report: per workload its request, peak use and advice, and the GPU-hours it would free."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query

from gpupool.api.deps import CurrentUser, SessionDep
from gpupool.api.errors import ERRORS
from gpupool.models.rightsizing import RightsizingReport
from gpupool.models.wire import UNIX_MAX, UNIX_MIN
from gpupool.services import rightsizing

router = APIRouter(tags=["reports"], responses=ERRORS)
UnixQ = Annotated[float | None, Query(description="Unix seconds", ge=UNIX_MIN, le=UNIX_MAX, allow_inf_nan=False)]
WEEK_S = 7 * 86400.0


@router.get("/reports/rightsizing", response_model=RightsizingReport)
def rightsizing_report(
    session: SessionDep,
    who: CurrentUser,
    project: Annotated[str | None, Query(max_length=63)] = None,
    start: UnixQ = None,
    end: UnixQ = None,
) -> RightsizingReport:
    """Workloads that held GPUs in the period (default: the week to now), in the projects the caller may read: the
    request, peak use and advice of each, and the GPU-hours the advice would have freed. Advice comes after 30
    minutes of samples: one GPU or less per worker with peak memory under half its grant and under 30% busy is
    advised `--gpu-memory` or `--gpu`; several whole GPUs of which fewer were ever busy at once, `--gpus k`."""
    until = end if end is not None else time.time()
    since = start if start is not None else until - WEEK_S
    return rightsizing.report(session, who, since, until, project)
