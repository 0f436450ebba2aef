"""The workloads router: submit, list (paged), describe, cancel, resume, logs and the usage report. No scheduling
loop runs here, so what is submitted stays pending; the one test that needs output runs cycles on a server of its
own. What runs, and how it ends, is the end-to-end tests' (tests/e2e)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.api.inprocess import Api
from tests.api.routers.factories import Factory, client

pytestmark = pytest.mark.anyio
NEVER = "this can never run: "


def fields(r: httpx.Response) -> tuple[int, list[tuple[list[Any], str]]]:
    return r.status_code, [(e["loc"], e["type"]) for e in r.json()["detail"]]


# -- submit ---------------------------------------------------------------------------------------------------


async def test_a_submitted_workload_is_pending_with_what_it_asked_for(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project(deserved_gpus=2)
    name = make.name("job")
    body = {"project": proj, "name": name, "gpus": 2, "workers": 2, "command": ["python", "train.py"]}
    r = await http.post("/api/v1/workloads", json=body, headers=make.admin.auth)
    out = r.json()
    # Why it waits (reason, its codes) is the lifecycle's to word; these fields are the submission's.
    stable = {k: out[k] for k in out if k not in ("id", "created_at") and not k.startswith("reason")}
    assert (r.status_code, stable) == (201, {
        "name": name, "project": proj, "owner": "admin", "type": "training", "priority": "training",
        "preemptible": True, "state": "pending", "node": None, "devices": [], "gpu_request": "2 × 2 GPUs",
        "gpus": 2, "gpu_milli": 0, "gpu_memory_mib": 0, "workers": 2, "attempt": 0, "exit_code": None,
        "gpu_util_pct": None, "max_duration_s": None, "eta": None, "eta_basis": None, "suspension": None,
        "started_at": None, "finished_at": None, "run": 1, "runs": 1,
    })  # fmt: skip


@pytest.mark.parametrize(
    ("fields_", "priority", "preemptible", "request_"),
    [
        ({"type": "batch", "gpu": 0.25}, "batch", True, "0.25 GPU"),
        ({"type": "inference", "port": 8000, "gpu_memory": "20GiB"}, "production", False, "20GiB GPU memory"),
        ({"type": "training", "priority": "batch", "preemptible": False}, "batch", False, "no GPU"),
    ],
)
async def test_the_type_gives_the_default_priority_and_preemptibility(
    http: httpx.AsyncClient,
    make: Factory,
    fields_: dict[str, Any],
    priority: str,
    preemptible: bool,
    request_: str,
) -> None:
    out = await make.workload(await make.project(), **fields_)
    assert (out["priority"], out["preemptible"], out["gpu_request"]) == (priority, preemptible, request_)


async def test_a_workload_without_a_name_gets_one_from_its_type(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    r = await http.post("/api/v1/workloads", json={"project": proj, "type": "batch", "command": ["true"]},
                        headers=make.admin.auth)  # fmt: skip
    assert r.status_code == 201 and re.fullmatch(r"batch-[0-9a-f]{6}", r.json()["name"])


async def test_a_name_is_one_workload_per_project(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    first = await make.workload(proj)
    r = await http.post("/api/v1/workloads", json={"project": proj, "name": first["name"], "command": ["true"]},
                        headers=make.admin.auth)  # fmt: skip
    assert (r.status_code, r.json()) == (
        409, {"detail": f"project {proj!r} already has a workload named {first['name']!r}"},
    )  # fmt: skip
    other = await make.project()
    assert (await make.workload(other, name=first["name"]))["project"] == other


async def test_an_idempotency_key_replays_the_first_answer(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    headers = {**make.admin.auth, "Idempotency-Key": make.name("key")}
    body = {"project": proj, "command": ["true"]}
    first = await http.post("/api/v1/workloads", json=body, headers=headers)
    again = await http.post("/api/v1/workloads", json=body, headers=headers)
    assert (first.status_code, again.status_code, again.json()) == (201, 200, first.json())
    listed = (await http.get("/api/v1/workloads", params={"project": proj}, headers=make.admin.auth)).json()
    assert [w["id"] for w in listed["items"]] == [first.json()["id"]]
    r = await http.post("/api/v1/workloads", json=body, headers={**make.admin.auth, "Idempotency-Key": "k" * 129})
    assert (r.status_code, r.json()) == (422, {"detail": "Idempotency-Key is longer than 128 characters"})


async def test_a_replay_naming_another_project_answers_with_the_workloads_own(
    http: httpx.AsyncClient, make: Factory
) -> None:
    first_project, second_project = await make.project(), await make.project()
    headers = {**make.admin.auth, "Idempotency-Key": make.name("key")}
    first = await http.post("/api/v1/workloads", json={"project": first_project, "command": ["true"]}, headers=headers)
    again = await http.post("/api/v1/workloads", json={"project": second_project, "command": ["true"]},
                            headers=headers)  # fmt: skip
    assert (again.status_code, again.json()) == (200, first.json())


@pytest.mark.parametrize(
    ("fields_", "reason"),
    [
        ({"gpus": 1, "gpu": 0.5}, "ask for one of gpu (a fraction), gpus (whole GPUs) or gpu_memory, not several"),
        ({"gpu": 1.5}, "gpu 1.5 is not a fraction between 0 and 1; ask for whole GPUs with gpus (--gpus in the CLI)"),
        ({"gpus": 5}, NEVER + "5 GPUs on one node: no node has more than 4"),
        ({"gpu_memory": "100GiB"}, NEVER + "102400 MiB of GPU memory: no device has more than 81920 MiB"),
        ({"gpus": 2, "workers": 3}, NEVER + "3 workers of this size: the cluster cannot hold them all at once"),
        ({"pools": ["a100"]}, "unknown pool 'a100'; pools: default"),
        ({"priority": "urgent"}, "unknown priority class 'urgent'; known classes: production, training, interactive, "
                                 "batch"),
        ({"gpus": 2, "preemptible": False}, NEVER + "not preemptible, and 2 GPUs is more than {p!r} (or its "
                                            "department) is guaranteed; ask for less or make it preemptible"),
        ({"command": []}, "a training workload needs a command (after --)"),
        ({"type": "notebook"}, "a notebook runs JupyterLab; it takes no command"),
        ({"type": "inference", "workers": 2}, "only training and batch workloads can have several workers"),
        ({"command": ["a\x00b"]}, "the command has a NUL byte or is longer than 128 KiB"),
    ],
)  # fmt: skip
async def test_what_could_never_run_is_refused_before_it_is_written(
    http: httpx.AsyncClient, make: Factory, fields_: dict[str, Any], reason: str
) -> None:
    proj = await make.project(deserved_gpus=1)
    name = make.name("job")
    body = {"project": proj, "name": name, "command": ["true"], **fields_}
    r = await http.post("/api/v1/workloads", json=body, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (422, {"detail": reason.format(p=proj)})
    assert (await http.get(f"/api/v1/workloads/{name}", headers=make.admin.auth)).status_code == 404


@pytest.mark.parametrize(
    ("body", "loc", "kind"),
    [
        ({"command": ["x"]}, ["body", "project"], "missing"),
        ({"project": "p", "type": "service", "command": ["x"]}, ["body", "type"], "literal_error"),
        ({"project": "p", "workers": 0, "command": ["x"]}, ["body", "workers"], "greater_than_equal"),
        ({"project": "p", "port": 80, "command": ["x"]}, ["body", "port"], "greater_than_equal"),
        ({"project": "p", "image": "-rm", "command": ["x"]}, ["body", "image"], "string_pattern_mismatch"),
        ({"project": "p", "grace_s": 3601, "command": ["x"]}, ["body", "grace_s"], "less_than_equal"),
        ({"project": "p", "retries": 3, "command": ["x"]}, ["body", "retries"], "extra_forbidden"),
    ],
)
async def test_a_submission_that_breaks_the_schema_is_422(
    http: httpx.AsyncClient, make: Factory, body: dict[str, Any], loc: list[str], kind: str
) -> None:
    assert fields(await http.post("/api/v1/workloads", json=body, headers=make.admin.auth)) == (422, [(loc, kind)])


async def test_a_workload_goes_into_a_project_only(http: httpx.AsyncClient, make: Factory) -> None:
    dept = await make.department()
    for project in ("nowhere", dept):
        r = await http.post("/api/v1/workloads", json={"project": project, "command": ["true"]},
                            headers=make.admin.auth)  # fmt: skip
        assert (r.status_code, r.json()) == (404, {"detail": f"no project named {project!r}"})


# -- list -----------------------------------------------------------------------------------------------------


async def test_the_list_pages_newest_first_by_cursor(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    ids = [(await make.workload(proj))["id"] for _ in range(5)]
    seen, cursors, params = [], [], {"project": proj, "limit": 2}
    while True:
        page = (await http.get("/api/v1/workloads", params=params, headers=make.admin.auth)).json()
        seen += [w["id"] for w in page["items"]]
        cursors.append(page["next_cursor"])
        if page["next_cursor"] is None:
            break
        params["cursor"] = page["next_cursor"]
    assert seen == ids[::-1]
    assert cursors == [str(ids[3]), str(ids[1]), None]


async def test_the_list_filters_by_state_and_project_and_shows_the_callers_projects(
    http: httpx.AsyncClient, make: Factory
) -> None:
    mine, theirs = await make.project(), await make.project()
    member = await make.user(mine)
    kept, cancelled = await make.workload(mine), await make.workload(mine)
    await make.workload(theirs)
    await make.ok("POST", f"/api/v1/workloads/{cancelled['id']}/cancel")
    page = (await http.get("/api/v1/workloads", headers=member.auth)).json()
    assert ([w["id"] for w in page["items"]], page["next_cursor"]) == ([cancelled["id"], kept["id"]], None)
    page = (await http.get("/api/v1/workloads", params={"state": "cancelled"}, headers=member.auth)).json()
    assert [w["id"] for w in page["items"]] == [cancelled["id"]]
    r = await http.get("/api/v1/workloads", params={"project": theirs}, headers=member.auth)
    assert (r.status_code, r.json()) == (404, {"detail": f"no project named {theirs!r}"})


async def test_the_list_filters_by_several_states_given_as_repeated_parameters(
    http: httpx.AsyncClient, make: Factory
) -> None:
    proj = await make.project()
    pending, cancelled = await make.workload(proj), await make.workload(proj)
    await make.ok("POST", f"/api/v1/workloads/{cancelled['id']}/cancel")
    both = {"project": proj, "state": ["cancelled", "pending"]}
    page = (await http.get("/api/v1/workloads", params=both, headers=make.admin.auth)).json()
    assert [w["id"] for w in page["items"]] == [cancelled["id"], pending["id"]]
    page = (await http.get("/api/v1/workloads", params={**both, "state": ["running", "succeeded"]},
                           headers=make.admin.auth)).json()  # fmt: skip
    assert page["items"] == []
    r = await http.get("/api/v1/workloads", params={**both, "state": ["pending", "sleeping"]}, headers=make.admin.auth)
    assert (r.status_code, r.json()["detail"][0]["loc"], r.json()["detail"][0]["msg"]) == (
        422, ["query", "state", 1], "Input should be 'pending', 'starting', 'running', 'preempted', 'suspended', "
        "'succeeded', 'failed' or 'cancelled'",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("query", "loc", "kind"),
    [
        ({"limit": 0}, ["query", "limit"], "greater_than_equal"),
        ({"limit": 1001}, ["query", "limit"], "less_than_equal"),
        ({"cursor": "1" * 33}, ["query", "cursor"], "string_too_long"),
        ({"project": "p" * 64}, ["query", "project"], "string_too_long"),
    ],
)
async def test_list_queries_out_of_bounds_are_422(
    http: httpx.AsyncClient, make: Factory, query: dict[str, Any], loc: list[str], kind: str
) -> None:
    assert fields(await http.get("/api/v1/workloads", params=query, headers=make.admin.auth)) == (422, [(loc, kind)])


async def test_listing_by_a_state_that_does_not_exist_is_422(http: httpx.AsyncClient, make: Factory) -> None:
    r = await http.get("/api/v1/workloads", params={"state": "sleeping"}, headers=make.admin.auth)
    assert (r.status_code, [e["loc"] for e in r.json()["detail"]]) == (422, [["query", "state", 0]])


# -- describe, cancel, resume ---------------------------------------------------------------------------------


async def test_a_workload_is_described_by_id_or_by_name(http: httpx.AsyncClient, make: Factory, api: Api) -> None:
    proj = await make.project()
    made = await make.workload(proj, type="inference", priority="training", port=8000, command=["serve"],
                               env={"MODE": "fast"})  # fmt: skip
    by_id = await http.get(f"/api/v1/workloads/{made['id']}", headers=make.admin.auth)
    by_name = await http.get(f"/api/v1/workloads/{made['name']}", headers=make.admin.auth)
    assert (by_id.status_code, by_id.headers["cache-control"], by_id.json()) == (200, "no-store", by_name.json())
    out = by_id.json()
    assert {k: out[k] for k in ("command", "env", "port", "grace_s", "fraction", "allocations")} == {
        "command": ["serve"], "env": {"MODE": "fast"}, "port": 8000, "grace_s": 30.0, "fraction": None,
        "allocations": [],
    }  # fmt: skip
    assert out["url"] == f"{api.ctx.settings.public_base_url}/apps/{proj}/{made['name']}/"
    assert [e["state"] for e in out["events"]] == ["pending"]


async def test_a_name_in_two_projects_needs_the_project(http: httpx.AsyncClient, make: Factory) -> None:
    a, b = await make.project(), await make.project()
    first = await make.workload(a)
    await make.workload(b, name=first["name"])
    r = await http.get(f"/api/v1/workloads/{first['name']}", headers=make.admin.auth)
    assert (r.status_code, r.json()) == (
        409, {"detail": f"several projects have a workload named {first['name']!r}; name the project"},
    )  # fmt: skip
    r = await http.get(f"/api/v1/workloads/{first['name']}", params={"project": a}, headers=make.admin.auth)
    assert (r.status_code, r.json()["id"]) == (200, first["id"])
    r = await http.get(f"/api/v1/workloads/{first['name']}", params={"project": "nowhere"}, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (404, {"detail": "no project named 'nowhere'"})


async def test_cancelling_pending_work_ends_it_at_once_and_only_once(http: httpx.AsyncClient, make: Factory) -> None:
    made = await make.workload(await make.project())
    r = await http.post(f"/api/v1/workloads/{made['name']}/cancel", headers=make.admin.auth)
    out = r.json()
    assert (r.status_code, out["state"]) == (200, "cancelled")
    assert out["finished_at"] is not None
    r = await http.post(f"/api/v1/workloads/{made['name']}/cancel", headers=make.admin.auth)
    assert (r.status_code, r.json()) == (409, {"detail": f"{made['name']!r} has already ended (cancelled)"})
    described = (await http.get(f"/api/v1/workloads/{made['id']}", headers=make.admin.auth)).json()
    assert [e["state"] for e in described["events"]] == ["pending", "cancelled"]


async def test_only_suspended_work_resumes(http: httpx.AsyncClient, make: Factory) -> None:
    made = await make.workload(await make.project())
    r = await http.post(f"/api/v1/workloads/{made['id']}/resume", headers=make.admin.auth)
    assert (r.status_code, r.json()) == (
        409, {"detail": f"{made['name']!r} is pending; only a workload suspended by a policy can be resumed"},
    )  # fmt: skip


@pytest.mark.parametrize("path", ["", "/cancel", "/resume", "/logs"])
async def test_a_project_named_with_a_nul_byte_is_refused(http: httpx.AsyncClient, make: Factory, path: str) -> None:
    method = "POST" if path in ("/cancel", "/resume") else "GET"
    r = await http.request(method, f"/api/v1/workloads/job{path}", params={"project": "a\x00b"},
                           headers=make.admin.auth)  # fmt: skip
    assert (r.status_code, r.json()) == (422, {"detail": "a NUL byte is not allowed in a path or a query"})


async def test_listing_a_project_named_with_a_nul_byte_is_refused(http: httpx.AsyncClient, make: Factory) -> None:
    r = await http.get("/api/v1/workloads", params={"project": "a\x00b"}, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (422, {"detail": "a NUL byte is not allowed in a path or a query"})


# -- logs -----------------------------------------------------------------------------------------------------


async def test_the_log_of_work_that_has_not_started_is_empty(http: httpx.AsyncClient, make: Factory) -> None:
    made = await make.workload(await make.project(), workers=2)
    r = await http.get(f"/api/v1/workloads/{made['name']}/logs", params={"rank": 1}, headers=make.admin.auth)
    assert (r.status_code, r.content, r.headers["x-next-offset"], r.headers["x-workload-state"]) == (
        200, b"", "0", "pending",
    )  # fmt: skip
    assert r.headers["content-type"] == "text/plain; charset=utf-8"
    r = await http.get(f"/api/v1/workloads/{made['name']}/logs", params={"rank": 2}, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (422, {"detail": f"{made['name']!r} has 2 member(s); rank 2 does not exist"})


async def test_a_log_is_read_from_an_offset_up_to_a_limit(fresh_api: Callable[..., Api]) -> None:
    api = fresh_api()
    async with client(api) as http:
        make = Factory(api, http)
        made = await make.workload(await make.project(), command=["sh", "-c", "echo hello; echo world"])
        await make.until_state(made, "succeeded")
        path = f"/api/v1/workloads/{made['id']}/logs"
        whole = await http.get(path, headers=make.admin.auth)
        assert (whole.content, whole.headers["x-next-offset"], whole.headers["x-workload-state"]) == (
            b"hello\nworld\n", "12", "succeeded",
        )  # fmt: skip
        part = await http.get(path, params={"offset": 6, "limit": 3}, headers=make.admin.auth)
        assert (part.content, part.headers["x-next-offset"]) == (b"wor", "9")
        end = await http.get(path, params={"offset": 12}, headers=make.admin.auth)
        assert (end.content, end.headers["x-next-offset"]) == (b"", "12")


async def test_an_offset_past_the_end_of_any_file_reads_nothing(fresh_api: Callable[..., Api]) -> None:
    api = fresh_api()
    async with client(api) as http:
        make = Factory(api, http)
        made = await make.workload(await make.project(), command=["echo", "hello"])
        await make.until_state(made, "succeeded")
        far = str(2**63 - 1)
        r = await http.get(f"/api/v1/workloads/{made['id']}/logs", params={"offset": far}, headers=make.admin.auth)
        assert (r.status_code, r.content, r.headers.get("x-next-offset")) == (200, b"", far)


# -- the usage report -----------------------------------------------------------------------------------------


async def test_a_usage_report_of_a_quiet_period_has_no_lines(http: httpx.AsyncClient, make: Factory) -> None:
    r = await http.get("/api/v1/reports/usage", params={"start": 0, "end": 3600, "by": "user"},
                       headers=make.admin.auth)  # fmt: skip
    zero = {"gpu_hours": 0.0, "busy_gpu_hours": 0.0, "idle_gpu_hours": 0.0, "cost": 0.0, "busy_cost": 0.0,
            "idle_cost": 0.0, "on_prem_cost": 0.0, "burst_cost": 0.0, "burst_gpu_hours": 0.0, "runs": 0}  # fmt: skip
    assert (r.status_code, r.json()) == (
        200,
        {"start": 0.0, "end": 3600.0, "by": "user", "lines": [], "total": {"key": "total", **zero}, "budgets": [],
         "unpriced_pools": []},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("query", "status", "detail"),
    [
        ({"start": 10, "end": 10}, 422, "the period is empty: 'to' must be after 'from'"),
        ({"start": 10, "end": 5}, 422, "the period is empty: 'to' must be after 'from'"),
        ({"start": 0, "end": 1, "by": "pool"}, 422, None),
        ({"start": "soon"}, 422, None),
    ],
)
async def test_a_usage_report_needs_a_period_and_a_known_grouping(
    http: httpx.AsyncClient, make: Factory, query: dict[str, Any], status: int, detail: str | None
) -> None:
    r = await http.get("/api/v1/reports/usage", params=query, headers=make.admin.auth)
    assert r.status_code == status
    if detail is not None:
        assert r.json() == {"detail": detail}
    else:
        expected = "string_pattern_mismatch" if "by" in query else "float_parsing"
        assert [e["type"] for e in r.json()["detail"]] == [expected]
