"""A name's runs: a finished name submitted again is a new run of it, the earlier ones its history; lists show a name
once, as its newest run with how many it has had (every run, numbered, when asked); applying the same spec again is
nothing, before and after it has finished, and another spec once it has finished is a new run. Over the real app and
store, with real processes, and the same app served to the real `gpupool` command line."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.api.inprocess import Api, on_socket
from tests.api.routers.factories import Factory, client
from tests.e2e.conftest import GPUPOOL

pytestmark = pytest.mark.anyio


def _runs(listed: dict[str, Any]) -> list[tuple[str, int, int, str]]:
    return [(w["name"], w["run"], w["runs"], w["state"]) for w in listed["items"]]


async def test_a_name_is_listed_once_with_its_runs_and_every_run_is_numbered(fresh_api: Callable[..., Api]) -> None:
    api = fresh_api(gpus="fake:1xH100-80GB")
    async with client(api) as http:
        make = Factory(api, http)
        project = await make.project()
        first = await make.workload(project, name="train", gpus=1)
        assert (first["run"], first["runs"]) == (1, 1)
        await make.until_state(first, "succeeded")
        again = await make.workload(project, name="train", gpus=1, command=["sleep", "300"])
        assert (again["run"], again["runs"]) == (2, 2)
        other = await make.workload(project, name="eval", gpu=0.5, command=["sleep", "300"])
        await make.until_state(again, "running")

        listed = await make.ok("GET", "/api/v1/workloads", project=project)
        assert _runs(listed) == [("eval", 1, 1, "pending"), ("train", 2, 2, "running")]  # eval: no GPU left
        every = await make.ok("GET", "/api/v1/workloads", project=project, all_runs="true")
        assert [(w["id"], w["run"], w["runs"]) for w in every["items"]] == [
            (other["id"], 1, 1), (again["id"], 2, 2), (first["id"], 1, 2)
        ]  # fmt: skip
        # A name's state is its newest run's: train has succeeded once, but what runs now is its second run.
        succeeded = await make.ok("GET", "/api/v1/workloads", project=project, state="succeeded")
        assert succeeded["items"] == []
        detail = await make.ok("GET", "/api/v1/workloads/train", project=project)
        assert (detail["id"], detail["run"], detail["runs"]) == (again["id"], 2, 2)
        assert [(h["id"], h["state"]) for h in detail["history"]] == [(first["id"], "succeeded")]
        # An older run, by its id, knows its number.
        old = await make.ok("GET", f"/api/v1/workloads/{first['id']}")
        assert (old["run"], old["runs"]) == (1, 2)


async def test_applying_a_spec_again_is_nothing_even_once_it_has_finished_and_another_spec_is_a_new_run(
    fresh_api: Callable[..., Api],
) -> None:
    api = fresh_api(gpus="fake:1xH100-80GB")
    async with client(api) as http:
        make = Factory(api, http)
        project = await make.project()
        spec = {"project": project, "command": ["true"]}

        async def apply(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
            r = await http.put("/api/v1/workloads/job", json=body, params={"project": project},
                               headers=make.admin.auth)  # fmt: skip
            return r.status_code, r.json()

        status, made = await apply(spec)
        assert (status, made["created"], made["run"]) == (201, True, 1)
        await make.until_state(made, "succeeded")
        for _ in range(2):
            status, same = await apply(spec)
            assert (status, same) == (200, {
                "id": made["id"], "name": "job", "project": project, "state": "succeeded", "created": False,
                "unchanged": True, "replaced": None, "run": 1,
            })  # fmt: skip
        status, changed = await apply({**spec, "command": ["sh", "-c", "exit 0"]})
        assert (status, changed["created"], changed["run"], changed["replaced"]) == (201, True, 2, None)
        await make.until_state(changed, "succeeded")
        status, back = await apply(spec)  # the newest run has the other spec: this one runs again, as run 3
        assert (status, back["created"], back["run"]) == (201, True, 3)
        listed = await make.ok("GET", "/api/v1/workloads", project=project)
        assert _runs(listed) == [("job", 3, 3, back["state"])]


def _run(url: str, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"GPUPOOL_URL": url, "GPUPOOL_TOKEN": token, "PATH": "/usr/bin:/bin", "HOME": str(Path.home()),
           "COLUMNS": "200"}  # fmt: skip
    return subprocess.run([GPUPOOL, *args], env=env, capture_output=True, text=True, timeout=60)


def _cli(url: str, token: str, *args: str) -> str:
    done = _run(url, token, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _table(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]


async def test_the_command_line_shows_a_name_once_with_its_runs_and_says_when_a_submit_is_a_new_run(
    fresh_api: Callable[..., Api],
) -> None:
    api = fresh_api(gpus="fake:1xH100-80GB")
    async with client(api) as http:
        make = Factory(api, http)
        project = await make.project()
        first = await make.workload(project, name="train")
        await make.until_state(first, "succeeded")
    with on_socket(api.app) as url:
        token = api.admin_token
        said = _cli(url, token, "submit", "-p", project, "--name", "train", "--gpus", "1", "--no-code", "--", "sleep",
                    "300")
        assert said == (f"workload train submitted to {project} (training, 1 GPU, training): pending; run 2 of "
                        "train, the earlier runs its history (gpupool describe train)\n")  # fmt: skip
        rows = _table(_cli(url, token, "list", "-p", project))
        assert [(r[0], r[1]) for r in rows] == [("train", "2")]  # NAME, then RUNS where a name has several
        every = _table(_cli(url, token, "list", "-p", project, "--all-runs"))
        assert [r[0] for r in every] == ["train #2", "train #1"]
        shown = _cli(url, token, "describe", "train", "-p", project)
        assert re.search(r"^Run:         2 of 2 of its name$", shown, re.MULTILINE), shown
        assert re.search(rf"^  #1  id {first['id']}  succeeded, exit 0, \S+ \S+$", shown, re.MULTILINE), shown
        # A run as list --all-runs labels it names that run, whatever a shell or a URL makes of '#'.
        for label in ("train #1", "train#1"):
            shown = _cli(url, token, "describe", label, "-p", project)
            assert shown.startswith(f"Name:        train  (id {first['id']})")
        done = _fails(url, token, "delete", "train#1", "-p", project, "--yes")
        assert done == "error: 'train#1' names one run: delete removes a name with all its runs (gpupool delete NAME)\n"
        assert _fails(url, token, "describe", "train#3", "-p", project) == "error: 'train' has no run 3\n"
        slash = _fails(url, token, "describe", "train/", "-p", project)
        assert slash == "error: 'train/' is not a name: names have no '/'\n"
        assert [r[0] for r in _table(_cli(url, token, "list", "-p", project, "--all-runs"))] == ["train #2", "train #1"]


def _fails(url: str, token: str, *args: str) -> str:
    done = _run(url, token, *args)
    assert done.returncode == 1, (done.stdout, done.stderr)
    return done.stderr
