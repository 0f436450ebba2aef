"""Schemathesis over the server's whole OpenAPI document, as the admin: no input it builds may get a 5xx, and
every answer (refusals included) must match the schema the document declares for its status.

The app is the real one, assembled as `gpupool server` assembles it and served in-process with its scheduler
loop stopped: fuzzed workloads are validated and written, never launched. Bounded: a fixed number of examples
per operation and mode, a deadline per example, derandomized so that a run is repeatable.

Schemathesis's own pytest loader (`from_fixture`) does not run under pytest 9.2, so this drives its strategies
with Hypothesis directly: one property per operation and generation mode.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from gpupool.api.errors import Problem
from tests.api.inprocess import Api, call, make_api

EXAMPLES = 25
"""Per operation and generation mode (and per pinned round): derandomized, so each run draws the same cases; 25
keeps the whole document (every operation, both modes, the pinned round) well under a minute on two cores."""
BUDGET_S = 300
CHECKS = [not_a_server_error, response_schema_conformance]


@pytest.fixture
def api(tmp_path: Path) -> Api:
    api = make_api(tmp_path)
    # An organisation for fuzzed workloads to land in, a member, and one workload for paths that name one.
    for path, body in (
        ("/api/v1/departments", {"name": "research", "deserved_gpus": 4}),
        ("/api/v1/projects", {"name": "vision", "department": "research", "deserved_gpus": 2}),
        ("/api/v1/users", {"name": "alice", "projects": ["vision"]}),
        ("/api/v1/workloads", {"project": "vision", "name": "w1", "command": ["true"]}),
    ):
        headers = [(b"authorization", api.auth()["Authorization"].encode()), (b"content-type", b"application/json")]
        assert call(api.app, "POST", path, headers, [json.dumps(body).encode()]).status == 201, path
    return api


# Random names seldom hit an object that exists: a second, positive round names the ones the fixture made, so
# that the fuzzing reaches past "not found" into the use cases.
PINNED = {"/workloads/{ref}": {"ref": "w1"}, "/queues/{name}": {"name": "vision"}, "/users/{name}": {"name": "alice"}}


def _pins(operation: schemathesis.APIOperation) -> dict[str, str] | None:
    return next((pin for part, pin in PINNED.items() if part in operation.path), None)


def _fuzz(api: Api, operation: schemathesis.APIOperation, mode: GenerationMode, pinned: bool) -> str | None:
    strategy = operation.as_strategy(generation_mode=mode, path_parameters=_pins(operation) if pinned else None)

    @settings(
        max_examples=EXAMPLES,
        deadline=5000,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @given(case=strategy)
    def check(case: schemathesis.Case) -> None:
        if pinned and isinstance(case.body, dict) and "project" in case.body:
            case.body["project"] = "vision"
        if isinstance(case.query, dict) and str(case.query.get("follow", "")).lower() in ("true", "1", "yes", "on"):
            # A followed log streams until its workload ends, and with the loop stopped none ever does.
            case.query["follow"] = "false"
        case.call_and_validate(headers=api.auth(), checks=CHECKS)

    try:
        check()
    except Unsatisfiable:  # negative mode, for an operation that takes no input at all
        return None
    except (Exception, BaseExceptionGroup) as e:  # failed checks (schemathesis groups them), with their cases
        return f"{operation.label} ({mode.value}{', pinned' if pinned else ''}): {e}"
    return None


def test_no_input_gets_a_server_error_and_every_answer_matches_the_schema(api: Api) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", api.app)
    # /readyz takes no input, and this app (no scheduler loop) is not ready by design: its 503 is its answer,
    # pinned in tests/api/routers/test_system.py, not a server error.
    operations = [op for op in (result.ok() for result in schema.get_all_operations()) if op.path != "/readyz"]
    assert len(operations) >= 20
    rounds = [(op, mode, False) for op in operations for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)]
    rounds += [(op, GenerationMode.POSITIVE, True) for op in operations if _pins(op) or op.body]
    started = time.monotonic()
    failures = [failure for op, mode, pinned in rounds if (failure := _fuzz(api, op, mode, pinned)) is not None]
    took = time.monotonic() - started
    assert not failures, "\n\n".join(failures)
    assert took < BUDGET_S, f"the fuzz run took {took:.0f}s; lower EXAMPLES"


# Hypothesis draws numbers the schema allows and strings at random: it seldom sends NaN, 10**30 or "²", which
# are what broke int() and the JSON encoder. This round sends such values, one at a time, in every path and query
# parameter and every body field the document declares, the rest of the request being valid.
HOSTILE_TEXT = ["NaN", "Infinity", "-Infinity", "1e309", "9" * 30, "-" + "9" * 30, "²", "١٢٣", "0x10", " 1", "1_0"]
HOSTILE_TEXT += ["", "a\n", "\u202ename", "../x", "x" * 10_000]
HOSTILE_JSON = [b"NaN", b"Infinity", b"-Infinity", b"1e309", b"9" * 30, b"-" + b"9" * 30, str(2**63).encode()]
HOSTILE_JSON += [
    str(2**31).encode(),
    b"-1",
    b"1.5",
    b'"\xc2\xb2"',
    b'"\xd9\xa1\xd9\xa2"',
    b"true",
    b"null",
    b"[]",
    b"{}",
]
HOSTILE_JSON += [json.dumps(text).encode() for text in HOSTILE_TEXT]
BASE_BODY = {
    "DepartmentCreate": {"name": "fz"},
    "ProjectCreate": {"name": "fzp", "department": "research"},
    "UserCreate": {"name": "fzu"},
    "WorkloadCreate": {"project": "vision", "command": ["true"]},
    "LoginRequest": {"name": "alice", "password": "not her password"},
    "PasswordSet": {"password": "a long password"},
}
PATH_VALUES = {"ref": "w1", "/queues/": "vision", "/users/": "alice", "/pools/": "default"}
"""What a path parameter that is not under test names: by its name, or by the path it is in."""
REQUIRED_QUERY = {"start": "0", "end": "3600"}


def _path_value(path: str, name: str) -> str:
    return PATH_VALUES.get(name) or next((v for k, v in PATH_VALUES.items() if k in path), "x")


def _cases(spec: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, str], bytes, str]]:
    """(method, path, query, body, what is hostile) for each hostile value in each input of each operation."""
    for template, operations in spec["paths"].items():
        for method, op in operations.items():
            params = [p for p in op.get("parameters", []) if p["in"] in ("path", "query")]
            base_path = template
            for p in params:
                if p["in"] == "path":
                    base_path = base_path.replace("{" + p["name"] + "}", _path_value(template, p["name"]))
            base_query = {
                p["name"]: REQUIRED_QUERY.get(p["name"], "1")
                for p in params
                if p.get("required") and p["in"] == "query"
            }
            ref = (
                op.get("requestBody", {})
                .get("content", {})
                .get("application/json", {})
                .get("schema", {})
                .get("$ref", "")
            )
            model = ref.rsplit("/", 1)[-1]
            base_body = BASE_BODY.get(model, {}) if model else None
            encoded = json.dumps(base_body).encode() if base_body is not None else b""
            for p in params:
                for text in HOSTILE_TEXT:
                    if p["in"] == "path":
                        path = template
                        for q in params:
                            if q["in"] == "path":
                                value = text if q is p else _path_value(template, q["name"])
                                path = path.replace("{" + q["name"] + "}", value)
                        yield method, path, base_query, encoded, f"path {p['name']}={text[:20]!r}"
                    else:
                        yield (
                            method,
                            base_path,
                            {**base_query, p["name"]: text},
                            encoded,
                            f"query {p['name']}={text[:20]!r}",
                        )
            if base_body is None:
                continue
            for field, schema in spec["components"]["schemas"][model]["properties"].items():
                for raw in HOSTILE_JSON:
                    value = b'{"notebook": ' + raw + b"}" if "additionalProperties" in schema else raw
                    body = json.dumps({**base_body, field: "@"}).encode().replace(b'"@"', value)
                    yield method, base_path, base_query, body, f"body {field}={raw[:20]!r}"


def test_hostile_values_in_every_input_get_a_4xx_with_the_documented_error_body(api: Api) -> None:
    spec = call(api.app, "GET", "/openapi.json").json()
    cases = list(_cases(spec))
    assert len(cases) > 1000
    failures = []
    for method, path, query, body, what in cases:
        headers = [(b"authorization", api.auth()["Authorization"].encode()), (b"content-type", b"application/json")]
        try:
            r = call(api.app, method.upper(), path, headers, [body], query=urlencode(query).encode())
        except Exception as e:  # what became a 500 (Starlette re-raises it after answering)
            failures.append(f"{method.upper()} {path} with {what}: {type(e).__name__}: {str(e)[:200]}")
            continue
        if r.status >= 500:
            failures.append(f"{method.upper()} {path} with {what}: {r.status}")
        elif r.status >= 400:
            try:
                Problem.model_validate_json(r.body)
            except ValueError as e:
                failures.append(f"{method.upper()} {path} with {what}: {r.status} {r.body[:200]!r} is no Problem: {e}")
    assert not failures, "\n".join(failures)
