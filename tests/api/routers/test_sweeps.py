"""Sweeps through the API: what a bad spec hears, and how a trial reports (the run itself: tests/e2e/test_sweeps.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import gpupool
from gpupool.models.sweeps import SweepCreate
from gpupool.services.sweep_driver import REPORT, RESULT, trial_spec
from tests.api.inprocess import Api
from tests.api.routers.factories import Factory, client

pytestmark = pytest.mark.anyio


def _spec(project: str, **fields: Any) -> dict[str, Any]:
    space = {"lr": {"type": "float", "low": 1e-5, "high": 1e-1, "log": True}, "opt": {"type": "categorical",
             "choices": ["adam", "sgd"]}}  # fmt: skip
    return {"name": "search", "project": project, "command": ["train", "--lr", "{lr}", "--opt={opt}"],
            "space": space, "trials": 4, "parallelism": 2} | fields  # fmt: skip


async def test_a_sweep_is_created_once_and_a_bad_spec_hears_why(fresh_api: Callable[..., Api]) -> None:
    api = fresh_api(gpus="fake:2xH100-80GB")
    async with client(api) as http:
        make = Factory(api, http)
        project = await make.project()
        member = await make.user(project)
        r = await http.post("/api/v1/sweeps", json=_spec(project), headers=member.auth)
        assert r.status_code == 201
        assert {k: r.json()[k] for k in ("name", "state", "trials", "parallelism", "counts", "best")} == {
            "name": "search",
            "state": "running",
            "trials": 4,
            "parallelism": 2,
            "counts": {},
            "best": None,
        }
        r = await http.post("/api/v1/sweeps", json=_spec(project), headers=member.auth)
        assert (r.status_code, r.json()) == (409, {"detail": f"a sweep named 'search' already exists in {project!r}"})
        bad = {"name": "b", "space": {"x": {"type": "float", "low": 2, "high": 1}}}
        r = await http.post("/api/v1/sweeps", json=_spec(project, **bad), headers=member.auth)
        assert r.status_code == 422 and "low is above high" in r.json()["detail"][0]["msg"]
        r = await http.post("/api/v1/sweeps", json=_spec(project, name="c", priority="urgent"), headers=member.auth)
        assert (r.status_code, r.json()["detail"][:34]) == (422, "unknown priority class 'urgent': p")
        r = await http.post("/api/v1/sweeps", json=_spec(project, name="d", trials=0), headers=member.auth)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "trials"
        r = await http.get(f"/api/v1/sweeps/{project}/nope", headers=member.auth)
        assert (r.status_code, r.json()) == (404, {"detail": f"no sweep named 'nope' in {project!r}"})
        r = await http.post(f"/api/v1/sweeps/{project}/search/cancel", headers=member.auth)
        assert (r.status_code, r.json()["state"]) == (200, "cancelled")


def test_a_trial_runs_the_command_with_its_values_and_reports_in_lines_the_driver_reads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = SweepCreate.model_validate(_spec("vision"))
    body = trial_spec(spec, "vision", "search", 7, {"lr": 0.001, "opt": "sgd"})
    assert (body.name, body.command, body.priority) == (
        "search-t0007",
        ["train", "--lr", "0.001", "--opt=sgd"],
        "batch",
    )
    assert {k: v for k, v in body.env.items() if k.startswith("SWEEP_")} == {
        "SWEEP_PARAM_LR": "0.001", "SWEEP_PARAM_OPT": "sgd", "SWEEP_NAME": "search", "SWEEP_TRIAL": "7"
    }  # fmt: skip
    gpupool.report(3, 0.25)
    gpupool.result(0.125)
    report, result = capsys.readouterr().out.encode().splitlines()
    m = REPORT.match(report)
    assert m is not None and (int(m.group(1)), float(m.group(2))) == (3, 0.25)
    m = RESULT.match(result)
    assert m is not None and float(m.group(1)) == 0.125
    with pytest.raises(ValueError, match="finite"):
        gpupool.report(1, float("nan"))
