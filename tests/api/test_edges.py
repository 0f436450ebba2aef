"""The API's edge, in-process: bodies capped before parsing, numbers bounded before int() or the database,
malformed JSON and Authorization headers refused with a 4xx, the workload environment's deny-list, and the
headers every response (and every token-bearing response) carries. Each case pins one status and one reason."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.types import Message, Receive, Scope, Send

from gpupool.api.deps import no_store
from gpupool.api.errors import MAX_BODY, BodyLimit
from tests.api.inprocess import Api, Raw, call, make_api

JSON = (b"content-type", b"application/json")
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Api:
    api = make_api(tmp_path_factory.mktemp("edges"))
    for path, body in (
        ("/api/v1/departments", {"name": "research", "deserved_gpus": 4}),
        ("/api/v1/projects", {"name": "vision", "department": "research", "deserved_gpus": 2}),
    ):
        assert post(api, path, body).status == 201
    return api


def auth(api: Api, token: bytes | None = None) -> tuple[bytes, bytes]:
    return (b"authorization", b"Bearer " + (token or api.admin_token.encode()))


def post(api: Api, path: str, body: Any, method: str = "POST") -> Raw:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    length = (b"content-length", str(len(data)).encode())
    return call(api.app, method, path, [auth(api), JSON, length], [data])


def get(api: Api, path: str, query: str = "") -> Raw:
    return call(api.app, "GET", path, [auth(api)], query=query.encode())


def fields(r: Raw) -> list[tuple[list[Any], str]]:
    """A 422's field errors as (where, pydantic's error type)."""
    return [(e["loc"], e["type"]) for e in r.json()["detail"]]


# -- 1. bodies over 1 MiB: 413 before anything parses them ---------------------------------------------------


def test_a_declared_length_over_the_cap_is_refused_before_the_body_is_read(api: Api) -> None:
    big = (b"content-length", str(MAX_BODY + 1).encode())
    r = call(api.app, "POST", "/api/v1/workloads", [auth(api), JSON, big], [b"{"])
    assert (r.status, r.json()) == (413, {"detail": f"the request body is over {MAX_BODY} bytes"})
    assert r.header("referrer-policy") == "no-referrer"  # the security headers wrap the refusal too


def test_a_chunked_body_over_the_cap_is_refused_and_nothing_is_written(api: Api) -> None:
    chunk = b" " * (64 * 1024)
    body = [b'{"project": "vision", "command": ["true"]', *[chunk] * 16, b"}"]  # 1 MiB + 42 bytes, no length
    r = call(api.app, "POST", "/api/v1/workloads", [auth(api), JSON], body)
    assert (r.status, r.json()) == (413, {"detail": f"the request body is over {MAX_BODY} bytes"})
    assert [m["type"] for m in r.messages] == ["http.response.start", "http.response.body"]
    assert get(api, "/api/v1/workloads").json()["items"] == []


def test_a_body_of_exactly_the_cap_is_parsed(api: Api) -> None:
    body = b" " * (MAX_BODY - 2) + b"{}"
    r = call(api.app, "POST", "/api/v1/departments", [auth(api), JSON], [body[: MIB // 2], body[MIB // 2 :]])
    assert (r.status, fields(r)) == (422, [(["body", "name"], "missing")])


def test_a_content_length_that_is_not_a_number_is_a_400(api: Api) -> None:
    r = call(api.app, "POST", "/api/v1/departments", [auth(api), JSON, (b"content-length", b"1e3")], [b"{}"])
    assert (r.status, r.json()) == (400, {"detail": "Content-Length is not one number"})


async def _echo_length(scope: Scope, receive: Receive, send: Send) -> None:
    size, more = 0, True
    while more:
        message: Message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(size).encode()})


def test_the_app_proxy_prefix_is_not_capped_and_everything_else_is() -> None:
    app = BodyLimit(_echo_length)
    chunks = [b"x" * MIB, b"x" * MIB]
    uploaded = call(app, "PUT", "/apps/vision/nb/api/contents/data.bin", chunks=chunks)
    assert (uploaded.status, uploaded.body) == (200, str(2 * MIB).encode())
    for path in ("/apps", "/appsx/upload", "/api/v1/workloads", "/portal/x"):
        assert call(app, "PUT", path, chunks=chunks).status == 413, path


# -- 2. numbers: 422 with a reason, never a 500 -----------------------------------------------------------------


def test_nan_and_infinity_in_a_body_are_422_and_the_reason_does_not_echo_them(api: Api) -> None:
    for literal in (b"NaN", b"Infinity", b"-Infinity"):
        r = post(api, "/api/v1/departments", b'{"name": "d1", "deserved_gpus": ' + literal + b"}")
        assert r.status == 422, literal
        assert r.json() == {
            "detail": [
                {"loc": ["body", "deserved_gpus"], "msg": "Input should be a finite number", "type": "finite_number"}
            ]
        }


BODY_NUMBERS = [
    ("/api/v1/departments", {"name": "d2", "weight": 10**30}, ["body", "weight"], "less_than_equal"),
    ("/api/v1/departments", {"name": "d2", "weight": "١٢٣"}, ["body", "weight"], "int_parsing"),
    ("/api/v1/departments", {"name": "d2", "weight": "²"}, ["body", "weight"], "int_parsing"),
    ("/api/v1/departments", {"name": "d2", "limit_gpus": 1e300}, ["body", "limit_gpus"], "less_than_equal"),
    ("/api/v1/workloads", {"project": "vision", "gpus": 10**30, "command": ["x"]}, ["body", "gpus"], "less_than_equal"),
    ("/api/v1/workloads", {"project": "vision", "gpus": 2**63, "command": ["x"]}, ["body", "gpus"], "less_than_equal"),
    ("/api/v1/workloads", {"project": "vision", "workers": "٣", "command": ["x"]}, ["body", "workers"], "int_parsing"),
    ("/api/v1/workloads", {"project": "vision", "port": 10**30, "command": ["x"]}, ["body", "port"], "less_than_equal"),
    ("/api/v1/workloads", {"project": "vision", "cpu": "1e309", "command": ["x"]}, ["body", "cpu"], "finite_number"),
]


@pytest.mark.parametrize(("path", "body", "loc", "kind"), BODY_NUMBERS)
def test_out_of_range_and_unicode_numbers_in_a_body_are_422(
    api: Api, path: str, body: dict[str, Any], loc: list[str], kind: str
) -> None:
    r = post(api, path, body)
    assert (r.status, fields(r)) == (422, [(loc, kind)])


@pytest.mark.parametrize(
    ("seconds", "kind"), [(float("nan"), "finite_number"), (float("inf"), "finite_number"), (1e300, "less_than_equal")]
)
def test_policy_limits_are_finite_and_bounded(api: Api, seconds: float, kind: str) -> None:
    r = post(api, "/api/v1/queues/vision/policy", {"idle_timeout_s": {"notebook": seconds}}, method="PATCH")
    assert (r.status, fields(r)) == (422, [(["body", "idle_timeout_s", "notebook"], kind)])


QUERY_NUMBERS = [
    ("/api/v1/reports/usage", "start=nan&end=1", [(["query", "start"], "finite_number")]),
    ("/api/v1/reports/usage", "start=0&end=inf", [(["query", "end"], "finite_number")]),
    ("/api/v1/reports/usage", "start=-Infinity&end=1", [(["query", "start"], "finite_number")]),
    ("/api/v1/reports/usage", "start=0&end=1e300", [(["query", "end"], "less_than_equal")]),
    ("/api/v1/reports/usage", "start=%D9%A1&end=2", [(["query", "start"], "float_parsing")]),
    ("/api/v1/reports/timeline", "start=nan", [(["query", "start"], "finite_number")]),
    ("/api/v1/workloads", "limit=" + "9" * 30, [(["query", "limit"], "less_than_equal")]),
    ("/api/v1/workloads", "limit=%C2%B2", [(["query", "limit"], "int_parsing")]),
    ("/api/v1/workloads/w/logs", "offset=" + "9" * 30, [(["query", "offset"], "less_than_equal")]),
]


@pytest.mark.parametrize(("path", "query", "expected"), QUERY_NUMBERS)
def test_non_finite_huge_and_unicode_numbers_in_a_query_are_422(
    api: Api, path: str, query: str, expected: list[tuple[list[str], str]]
) -> None:
    r = get(api, path, query)
    assert (r.status, fields(r)) == (422, expected)


NEITHER = "is neither a workload id (ASCII digits), a workload name (a DNS label) nor a run of one (NAME#N)"
REFS = [
    ("/api/v1/workloads/%C2%B2", f"'²' {NEITHER}"),
    ("/api/v1/workloads/%D9%A1%D9%A2%D9%A3", f"'١٢٣' {NEITHER}"),
    ("/api/v1/workloads/nb%23%C2%B2", f"'nb#²' {NEITHER}"),  # a run's number in ASCII digits too
    (
        "/api/v1/workloads/" + "9" * 30,
        "workload id '999999999999999999999999' is out of range: ids go up to 2147483647",
    ),
    ("/api/v1/workloads/2147483648/logs", "workload id '2147483648' is out of range: ids go up to 2147483647"),
]


@pytest.mark.parametrize(("path", "reason"), REFS)
def test_a_workload_reference_that_is_neither_an_id_nor_a_name_is_422(api: Api, path: str, reason: str) -> None:
    from urllib.parse import unquote

    r = call(api.app, "GET", unquote(path), [auth(api)])
    assert (r.status, r.json()) == (422, {"detail": reason})


def test_the_largest_id_is_looked_up_and_not_found(api: Api) -> None:
    r = get(api, "/api/v1/workloads/2147483647")
    assert (r.status, r.json()) == (404, {"detail": "no workload named '2147483647'"})


@pytest.mark.parametrize("cursor", ["²", "١٢", "9" * 30, "-1"])
def test_a_cursor_that_is_not_an_id_is_422(api: Api, cursor: str) -> None:
    r = call(api.app, "GET", "/api/v1/workloads", [auth(api)], query=f"cursor={cursor}".encode())
    assert (r.status, r.json()) == (422, {"detail": "cursor is not one this server handed out"})


UNITS = "GB = 10^9 bytes, GiB = 2^30; also MB, MiB, TB, TiB and Kubernetes' G, Gi; a bare number is MiB"


@pytest.mark.parametrize(
    ("size", "reason"),
    [
        ("١٢٣GiB", f"memory '١٢٣GiB': expected a size like 20GiB or 512MiB ({UNITS})"),
        ("²GiB", f"memory '²GiB': expected a size like 20GiB or 512MiB ({UNITS})"),
        ("9" * 16 + "GiB", f"memory '9999999999999999GiB': expected a size like 20GiB or 512MiB ({UNITS})"),
        ("999999999999GiB", "memory '999999999999GiB' is more than 1 EiB"),
        ("16XB", f"memory '16XB': unknown unit 'XB'; {UNITS}"),
    ],
)
def test_sizes_are_ascii_and_bounded(api: Api, size: str, reason: str) -> None:
    r = post(api, "/api/v1/workloads", {"project": "vision", "memory": size, "command": ["true"]})
    assert (r.status, r.json()) == (422, {"detail": reason})


def test_gb_is_a_power_of_1000_and_gib_of_1024(api: Api) -> None:
    asked = {"16GB": 15259, "16GiB": 16384, "16G": 15259, "16Gi": 16384}  # 16 * 10^9 bytes: 15,258.79 MiB, up
    got = {}
    for size in asked:
        r = post(api, "/api/v1/workloads", {"project": "vision", "memory": size, "command": ["true"]})
        assert r.status == 201, r.body
        got[size] = get(api, f"/api/v1/workloads/{r.json()['id']}").json()["memory_mib"]
    assert got == asked


# -- 3. bodies that are not JSON, or not UTF-8 ------------------------------------------------------------------


def test_a_body_that_is_not_json_is_a_400_with_the_parse_error(api: Api) -> None:
    r = post(api, "/api/v1/departments", b'{"name": "d3",')
    assert (r.status, r.json()) == (
        400,
        {"detail": "the body is not valid JSON: Expecting property name enclosed in double quotes"},
    )


def test_a_body_that_is_not_utf8_is_a_400(api: Api) -> None:
    r = post(api, "/api/v1/departments", b'{"name": "\xff\xfe"}')
    assert (r.status, r.json()) == (400, {"detail": "There was an error parsing the body"})


def test_a_body_nested_ten_thousand_deep_is_a_400(api: Api) -> None:
    r = post(api, "/api/v1/departments", b"[" * 10_000 + b"]" * 10_000)
    assert (r.status, r.json()) == (400, {"detail": "There was an error parsing the body"})


# -- 4. malformed Authorization headers: 401 with WWW-Authenticate: Bearer --------------------------------------

MALFORMED = [
    None,
    b"gp_notascheme",
    b"Basic eHl6OnB3",
    b"Bearer",
    b"Bearer ",
    b"Bearer " + b"a" * 10_240,
    b"Bearer gp_\xc3\xa9t\xc3\xa9",
    b"Bearer gps_\xb2_9999999999_0",  # Latin-1 "²": isdigit() says yes and int() refuses
    b"Bearer gps_1_\xb2\xb2_0",
    b"Bearer gps_" + b"9" * 40 + b"_9999999999_" + b"0" * 64,
    b"Bearer gp_a b",
    b"bearer gp_forged",
]


@pytest.mark.parametrize("value", MALFORMED)
def test_a_malformed_authorization_header_is_a_401_that_asks_for_a_bearer_token(api: Api, value: bytes | None) -> None:
    headers = [] if value is None else [(b"authorization", value)]
    r = call(api.app, "GET", "/api/v1/whoami", headers)
    assert (r.status, r.json()) == (401, {"detail": "a valid bearer token is required"})
    assert r.header("www-authenticate") == "Bearer"


# -- 5. headers: Referrer-Policy everywhere, no-store where a token is in the answer ----------------------------


def test_every_response_says_no_referrer(api: Api) -> None:
    answers = [
        call(api.app, "GET", "/healthz"),
        call(api.app, "GET", "/"),
        call(api.app, "GET", "/api/v1/whoami"),
        call(api.app, "GET", "/nowhere"),
        get(api, "/api/v1/projects"),
    ]
    assert [(r.status, r.header("referrer-policy")) for r in answers] == [
        (200, "no-referrer"),
        (200, "no-referrer"),
        (401, "no-referrer"),
        (404, "no-referrer"),
        (200, "no-referrer"),
    ]
    assert answers[-1].header("cache-control") is None


def test_answers_that_carry_a_token_are_not_stored(api: Api) -> None:
    created = post(api, "/api/v1/users", {"name": "carol", "projects": ["vision"]})
    assert (created.status, created.header("cache-control")) == (201, "no-store")
    assert post(api, "/api/v1/users/carol/password", {"password": "a long password"}, method="PUT").status == 204
    login = post(api, "/api/v1/login", {"name": "carol", "password": "a long password"})
    assert (login.status, login.header("cache-control")) == (200, "no-store")
    assert post(api, "/api/v1/workloads", {"project": "vision", "name": "nb", "command": ["true"]}).status == 201
    described = get(api, "/api/v1/workloads/nb")
    assert (described.status, described.header("cache-control")) == (200, "no-store")


def _has_token(model: Any) -> bool:
    return isinstance(model, type) and issubclass(model, BaseModel) and "token" in model.model_fields


def _api_routes(routes: list[Any]) -> list[APIRoute]:
    """The app's routes, through included routers (FastAPI 0.16x keeps each as a wrapper of the original)."""
    out: list[APIRoute] = []
    for r in routes:
        if isinstance(r, APIRoute):
            out.append(r)
        elif getattr(r, "original_router", None) is not None:
            out += _api_routes(r.original_router.routes)
    return out


def test_every_route_whose_answer_has_a_token_field_declares_no_store(api: Api) -> None:
    with_token = [r for r in _api_routes(api.app.routes) if _has_token(r.response_model)]
    assert {"create_user", "login"} <= {r.name for r in with_token}
    assert [r.name for r in with_token if no_store not in [d.dependency for d in r.dependencies]] == []


def test_the_openapi_document_declares_the_error_body(api: Api) -> None:
    spec = call(api.app, "GET", "/openapi.json").json()
    submit = spec["paths"]["/api/v1/workloads"]["post"]["responses"]
    assert sorted(submit) == ["201", "400", "401", "403", "404", "409", "413", "422"]
    assert submit["422"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Problem"}


# -- 6. the environment a workload may not set ----------------------------------------------------------------

DENIED = [
    *("LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PATH", "PYTHONPATH", "BASH_ENV", "ENV"),
    *("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
    *("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "JUPYTER_TOKEN", "JUPYTER_CONFIG_DIR"),
    *("JUPYTERHUB_API_TOKEN", "GPUPOOL_TOKEN", "GPUPOOL_URL", "RANK", "MASTER_ADDR"),
]


@pytest.mark.parametrize("key", DENIED)
def test_a_denied_environment_variable_is_refused_by_name_and_nothing_is_written(api: Api, key: str) -> None:
    r = post(api, "/api/v1/workloads", {"project": "vision", "name": "envy", "env": {key: "x"}, "command": ["true"]})
    assert (r.status, r.json()) == (
        422,
        {
            "detail": f"environment variable {key!r} is reserved: it is set by gpupool, or it changes how the programs "
            "gpupool starts load code (LD_*, PATH, PYTHONPATH, BASH_ENV, ...); use another name"
        },
    )
    assert get(api, "/api/v1/workloads/envy").status == 404


def test_ordinary_environment_variables_are_accepted(api: Api) -> None:
    env = {"OMP_NUM_THREADS": "4", "HF_HOME": "/data/hf", "path": "lowercase is another variable", "MY_LD_FLAGS": "x"}
    r = post(api, "/api/v1/workloads", {"project": "vision", "name": "env-ok", "env": env, "command": ["true"]})
    assert r.status == 201
    assert get(api, "/api/v1/workloads/env-ok").json()["env"] == env


def test_a_trailing_newline_does_not_slip_through_a_name_or_an_environment_key(api: Api) -> None:
    named = post(api, "/api/v1/workloads", {"project": "vision", "name": "x\n", "command": ["true"]})
    assert (named.status, fields(named)) == (422, [(["body", "name"], "value_error")])
    keyed = post(api, "/api/v1/workloads", {"project": "vision", "env": {"KEY\n": "v"}, "command": ["true"]})
    assert (keyed.status, keyed.json()) == (422, {"detail": "environment variable name 'KEY\\n' is not valid"})
