"""httpx under, wire models over. Errors come back as ApiError with the server's reason."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter

from gpupool.models.access import (
    AuditPublic,
    MemberPublic,
    MemberSet,
    ProjectSettings,
    SecretPublic,
    SecretSet,
    TokenCreate,
    TokenCreated,
    TokenPublic,
)
from gpupool.models.accounts import (
    DevicePending,
    DeviceStart,
    LoginResponse,
    Offboarded,
    Offboarding,
    SsoConfig,
    UserCreate,
    UserCreated,
    UserPublic,
    WhoAmI,
)
from gpupool.models.attempts import ApplyResult
from gpupool.models.clusters import (
    ClusterCreate,
    ClusterDetail,
    ClusterDrain,
    ClusterPublic,
    DepartmentBurstPublic,
    DepartmentBurstSet,
)
from gpupool.models.code import CodeLimits, CodeManifest, CodeMissing, CodeMissingReply, CodeStored
from gpupool.models.rightsizing import RightsizingReport
from gpupool.models.schemas import (
    DepartmentCreate,
    NodePublic,
    Page,
    PolicyPublic,
    PolicyUpdate,
    ProjectCreate,
    QueuePublic,
    QuotaUpdate,
    UsageReport,
    WorkloadCreate,
    WorkloadDetail,
    WorkloadPublic,
)
from gpupool.models.sweeps import SweepCreate, SweepDetail, SweepPublic
from gpupool.models.system import Health, PoolPublic, PoolUpdate, Readiness

M = TypeVar("M", bound=BaseModel)


class ApiError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status}: {reason}")
        self.status = status
        self.reason = reason


def _q(part: object) -> str:
    """A value as one segment of a path: quoted whole, so a `#` or `?` in a name the caller typed cannot cut the
    path short (`delete 'nb#1'` deleting nb); a `/`, which the server would read as a separator even quoted, is
    refused here, as no name, id or digest has one."""
    text = str(part)
    if "/" in text:
        raise ApiError(400, f"{text[:80]!r} is not a name: names have no '/'")
    return quote(text, safe="")


def _reason(resp: httpx.Response) -> str:
    try:
        detail = resp.json().get("detail")
    except ValueError:
        return resp.text or resp.reason_phrase
    if isinstance(detail, list):  # pydantic's validation errors: say which field and why
        parts = []
        for err in detail:
            loc = ".".join(str(x) for x in err.get("loc", ())[1:]) or "body"
            parts.append(f"{loc}: {err.get('msg', 'invalid')}")
        return "; ".join(parts)
    return str(detail)


class Client:
    def __init__(
        self, url: str, token: str | None, *, timeout: float = 30.0, transport: httpx.BaseTransport | None = None
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, *, accept: tuple[int, ...] = (), **kw: Any) -> httpx.Response:
        """The response; an error status not in `accept` is raised as ApiError."""
        try:
            resp = self._http.request(method, path, **kw)
        except httpx.HTTPError as e:
            raise ApiError(0, f"cannot reach gpupool at {self.url}: {e}") from None
        if resp.status_code >= 400 and resp.status_code not in accept:
            raise ApiError(resp.status_code, _reason(resp))
        return resp

    def _get(self, model: type[M], path: str, **kw: Any) -> M:
        return model.model_validate(self._call("GET", path, **kw).json())

    def _list(self, model: type[M], path: str, **kw: Any) -> list[M]:
        return TypeAdapter(list[model]).validate_python(self._call("GET", path, **kw).json())  # type: ignore[valid-type]

    def _send(self, model: type[M], method: str, path: str, body: BaseModel | None = None, **kw: Any) -> M:
        if body is not None:
            kw["json"] = body.model_dump(mode="json", exclude_none=True)
        return model.model_validate(self._call(method, path, **kw).json())

    # -- system ---------------------------------------------------------------------------------------------
    def health(self) -> Health:
        return self._get(Health, "/healthz")

    def ready(self) -> Readiness:
        """/readyz: whether the server should get traffic (store and scheduler loop). A server that is not ready
        answers 503 with the same report, returned here rather than raised."""
        return Readiness.model_validate(self._call("GET", "/readyz", accept=(503,)).json())

    def whoami(self) -> WhoAmI:
        return self._get(WhoAmI, "/api/v1/whoami")

    def metrics(self) -> str:
        return self._call("GET", "/metrics").text

    # -- organisation ---------------------------------------------------------------------------------------
    def create_department(self, body: DepartmentCreate) -> QueuePublic:
        return self._send(QueuePublic, "POST", "/api/v1/departments", body)

    def list_departments(self) -> list[QueuePublic]:
        return self._list(QueuePublic, "/api/v1/departments")

    def create_project(self, body: ProjectCreate) -> QueuePublic:
        return self._send(QueuePublic, "POST", "/api/v1/projects", body)

    def list_projects(self) -> list[QueuePublic]:
        return self._list(QueuePublic, "/api/v1/projects")

    def update_quota(self, name: str, body: QuotaUpdate) -> QueuePublic:
        return self._send(QueuePublic, "PATCH", f"/api/v1/queues/{_q(name)}/quota", body)

    def get_policy(self, name: str) -> PolicyPublic:
        return self._get(PolicyPublic, f"/api/v1/queues/{_q(name)}/policy")

    def update_policy(self, name: str, body: PolicyUpdate) -> PolicyPublic:
        return self._send(PolicyPublic, "PATCH", f"/api/v1/queues/{_q(name)}/policy", body)

    def usage(self, start: float | None = None, end: float | None = None, by: str = "project") -> UsageReport:
        """Usage from `start` (the server's default: a day before `end`) to `end` (default: now)."""
        params = {k: v for k, v in (("start", start), ("end", end), ("by", by)) if v is not None}
        return self._get(UsageReport, "/api/v1/reports/usage", params=params)

    def rightsizing(
        self, project: str | None = None, start: float | None = None, end: float | None = None
    ) -> RightsizingReport:
        """Right-sizing advice per workload and the GPU-hours it would free (the server's default: the last week)."""
        params = {k: v for k, v in (("project", project), ("start", start), ("end", end)) if v is not None}
        return self._get(RightsizingReport, "/api/v1/reports/rightsizing", params=params)

    def create_user(self, body: UserCreate) -> UserCreated:
        return self._send(UserCreated, "POST", "/api/v1/users", body)

    def set_password(self, name: str, password: str, current: str | None = None) -> None:
        body = {"password": password, **({"current": current} if current is not None else {})}
        self._call("PUT", f"/api/v1/users/{_q(name)}/password", json=body)

    def list_users(self, deleted: bool = False) -> list[UserPublic]:
        return self._list(UserPublic, "/api/v1/users", params={"deleted": "true"} if deleted else {})

    def disable_user(self, name: str, keep_work: bool = False) -> Offboarded:
        """Nothing the user holds signs in until enabled again; its live work is cancelled unless `keep_work`."""
        return self._send(Offboarded, "POST", f"/api/v1/users/{_q(name)}/disable", Offboarding(keep_work=keep_work))

    def enable_user(self, name: str) -> Offboarded:
        return self._send(Offboarded, "POST", f"/api/v1/users/{_q(name)}/enable")

    def delete_user(self, name: str, keep_work: bool = False) -> Offboarded:
        params = {"keep_work": "true"} if keep_work else {}
        return self._send(Offboarded, "DELETE", f"/api/v1/users/{_q(name)}", params=params)

    def logout(self) -> None:
        self._call("POST", "/api/v1/logout")

    # -- access ---------------------------------------------------------------------------------------------
    def create_token(self, body: TokenCreate) -> TokenCreated:
        return self._send(TokenCreated, "POST", "/api/v1/tokens", body)

    def list_tokens(self, revoked: bool = False) -> list[TokenPublic]:
        return self._list(TokenPublic, "/api/v1/tokens", params={"revoked": revoked})

    def revoke_token(self, token_id: int) -> TokenPublic:
        return self._send(TokenPublic, "DELETE", f"/api/v1/tokens/{_q(token_id)}")

    def list_members(self, queue: str) -> list[MemberPublic]:
        return self._list(MemberPublic, f"/api/v1/queues/{_q(queue)}/members")

    def set_member(self, queue: str, user: str, role: str) -> MemberPublic:
        body = MemberSet.model_validate({"role": role})
        return self._send(MemberPublic, "PUT", f"/api/v1/queues/{_q(queue)}/members/{_q(user)}", body)

    def remove_member(self, queue: str, user: str, keep_work: bool = False) -> Offboarded:
        """Their live work in the project is cancelled unless `keep_work`."""
        params = {"keep_work": "true"} if keep_work else {}
        return self._send(Offboarded, "DELETE", f"/api/v1/queues/{_q(queue)}/members/{_q(user)}", params=params)

    def update_project(self, name: str, body: ProjectSettings) -> QueuePublic:
        return self._send(QueuePublic, "PATCH", f"/api/v1/projects/{_q(name)}", body)

    def set_secret(self, project: str, name: str, value: str) -> SecretPublic:
        path = f"/api/v1/projects/{_q(project)}/secrets/{_q(name)}"
        return self._send(SecretPublic, "PUT", path, SecretSet(value=value))

    def list_secrets(self, project: str) -> list[SecretPublic]:
        return self._list(SecretPublic, f"/api/v1/projects/{_q(project)}/secrets")

    def delete_secret(self, project: str, name: str) -> None:
        self._call("DELETE", f"/api/v1/projects/{_q(project)}/secrets/{_q(name)}")

    def audit(self, since: float | None = None, actor: str | None = None, limit: int = 200) -> list[AuditPublic]:
        params: dict[str, Any] = {"limit": limit}
        if since is not None:
            params["since"] = since
        if actor is not None:
            params["actor"] = actor
        return self._list(AuditPublic, "/api/v1/audit", params=params)

    # -- workloads ------------------------------------------------------------------------------------------
    def submit(self, body: WorkloadCreate, idempotency_key: str | None = None) -> WorkloadPublic:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._send(WorkloadPublic, "POST", "/api/v1/workloads", body, headers=headers)

    def list_workloads(
        self,
        project: str | None = None,
        state: str | Sequence[str] | None = None,
        limit: int = 1000,
        user: str | None = None,
        all_runs: bool = False,
    ) -> list[WorkloadPublic]:
        """Every page, newest first; `state`: in this state or any of these; `user`: only those this user
        submitted; a name once, as its newest run, unless `all_runs`."""
        out: list[WorkloadPublic] = []
        asked = {"project": project, "state": state, "limit": limit, "user": user, "all_runs": all_runs or None}
        params: dict[str, Any] = {k: v for k, v in asked.items() if v}
        while True:
            page = Page[WorkloadPublic].model_validate(self._call("GET", "/api/v1/workloads", params=params).json())
            out.extend(page.items)
            if not page.next_cursor:
                return out
            params["cursor"] = page.next_cursor

    def describe(self, ref: str, project: str | None = None) -> WorkloadDetail:
        return self._get(WorkloadDetail, f"/api/v1/workloads/{_q(ref)}", params=_project(project))

    def cancel(self, ref: str, project: str | None = None) -> WorkloadPublic:
        return self._send(WorkloadPublic, "POST", f"/api/v1/workloads/{_q(ref)}/cancel", params=_project(project))

    def resume(self, ref: str, project: str | None = None) -> WorkloadPublic:
        return self._send(WorkloadPublic, "POST", f"/api/v1/workloads/{_q(ref)}/resume", params=_project(project))

    def rerun(self, ref: str, project: str | None = None) -> WorkloadPublic:
        """A finished workload's spec again under its name (a new workload; the old one stays as its history)."""
        return self._send(WorkloadPublic, "POST", f"/api/v1/workloads/{_q(ref)}/rerun", params=_project(project))

    def delete(self, ref: str, project: str | None = None) -> list[int]:
        """Deletes a finished workload, the earlier ones of its name, and their files: the ids deleted."""
        resp = self._call("DELETE", f"/api/v1/workloads/{_q(ref)}", params=_project(project))
        return [int(x) for x in resp.json()["deleted"]]

    def apply(self, body: WorkloadCreate, force: bool = False) -> ApplyResult:
        """The spec under its name, declaratively: `unchanged` where the live workload has it; a 409 naming what
        differs unless `force` (which replaces the live one); otherwise submitted."""
        if body.name is None:
            raise ValueError("apply needs a name: it is what the spec is applied to")
        params = {"project": body.project, **({"force": "true"} if force else {})}
        return self._send(ApplyResult, "PUT", f"/api/v1/workloads/{_q(body.name)}", body, params=params)

    def logs(self, ref: str, project: str | None = None, rank: int = 0, offset: int = 0) -> tuple[bytes, int, str]:
        """(bytes from offset, the next offset, the workload's state)."""
        params = {**_project(project), "rank": rank, "offset": offset}
        resp = self._call("GET", f"/api/v1/workloads/{_q(ref)}/logs", params=params)
        return resp.content, int(resp.headers["X-Next-Offset"]), resp.headers["X-Workload-State"]

    def follow_logs(self, ref: str, project: str | None = None, rank: int = 0, offset: int = 0) -> Iterator[bytes]:
        """A member's output from offset as it is written, until the workload has ended."""
        params: dict[str, Any] = {**_project(project), "rank": rank, "offset": offset, "follow": "true"}
        try:
            with self._http.stream("GET", f"/api/v1/workloads/{_q(ref)}/logs", params=params, timeout=None) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise ApiError(resp.status_code, _reason(resp))
                yield from resp.iter_bytes()
        except httpx.HTTPError as e:
            raise ApiError(0, f"lost gpupool at {self.url}: {e}") from None

    # -- code (gpupool.client.code packs a directory and uploads it through these) ------------------------------
    def code_limits(self) -> CodeLimits:
        return self._get(CodeLimits, "/api/v1/code/limits")

    def code_missing(self, project: str, digests: list[str]) -> list[str]:
        body = CodeMissing(project=project, digests=digests)
        return self._send(CodeMissingReply, "POST", "/api/v1/code/missing", body).missing

    def put_code_blob(self, project: str, digest: str, data: bytes) -> None:
        headers = {"Content-Type": "application/octet-stream"}
        path = f"/api/v1/code/blobs/{_q(digest)}"
        self._call("PUT", path, params={"project": project}, content=data, headers=headers)

    def put_code_manifest(self, project: str, manifest: CodeManifest) -> CodeStored:
        return self._send(CodeStored, "PUT", "/api/v1/code/manifests", manifest, params={"project": project})

    def workload_code(self, ref: str, project: str | None = None) -> CodeManifest:
        return self._get(CodeManifest, f"/api/v1/workloads/{_q(ref)}/code", params=_project(project))

    def workload_code_blob(self, ref: str, digest: str, project: str | None = None) -> bytes:
        path = f"/api/v1/workloads/{_q(ref)}/code/blobs/{_q(digest)}"
        return self._call("GET", path, params=_project(project)).content

    def collect_code(self, grace_s: float | None = None) -> dict[str, int]:
        params = {} if grace_s is None else {"grace_s": grace_s}
        out: dict[str, int] = self._call("POST", "/api/v1/code/collect", params=params).json()
        return out

    def nodes(self) -> list[NodePublic]:
        return self._list(NodePublic, "/api/v1/nodes")

    def list_pools(self) -> list[PoolPublic]:
        return self._list(PoolPublic, "/api/v1/pools")

    def update_pool(self, name: str, body: PoolUpdate) -> PoolPublic:
        return self._send(PoolPublic, "PATCH", f"/api/v1/pools/{_q(name)}", body)

    # -- clusters --------------------------------------------------------------------------------------------
    def list_clusters(self) -> list[ClusterPublic]:
        return self._list(ClusterPublic, "/api/v1/clusters")

    def add_cluster(self, body: ClusterCreate) -> ClusterPublic:
        return self._send(ClusterPublic, "POST", "/api/v1/clusters", body)

    def describe_cluster(self, name: str) -> ClusterDetail:
        return self._get(ClusterDetail, f"/api/v1/clusters/{_q(name)}")

    def drain_cluster(self, name: str, draining: bool = True) -> ClusterPublic:
        return self._send(ClusterPublic, "POST", f"/api/v1/clusters/{_q(name)}/drain", ClusterDrain(draining=draining))

    def remove_cluster(self, name: str) -> None:
        self._call("DELETE", f"/api/v1/clusters/{_q(name)}")

    def create_sweep(self, body: SweepCreate) -> SweepPublic:
        return self._send(SweepPublic, "POST", "/api/v1/sweeps", body)

    def list_sweeps(self) -> list[SweepPublic]:
        return self._list(SweepPublic, "/api/v1/sweeps")

    def describe_sweep(self, project: str, name: str) -> SweepDetail:
        return self._get(SweepDetail, f"/api/v1/sweeps/{_q(project)}/{_q(name)}")

    def sweep_plot(self, project: str, name: str) -> bytes:
        return self._call("GET", f"/api/v1/sweeps/{_q(project)}/{_q(name)}/plot.png").content

    def cancel_sweep(self, project: str, name: str) -> SweepPublic:
        return self._send(SweepPublic, "POST", f"/api/v1/sweeps/{_q(project)}/{_q(name)}/cancel")

    def department_burst(self, name: str) -> DepartmentBurstPublic:
        return self._get(DepartmentBurstPublic, f"/api/v1/departments/{_q(name)}/burst")

    def set_department_burst(self, name: str, body: DepartmentBurstSet) -> DepartmentBurstPublic:
        return DepartmentBurstPublic.model_validate(
            self._call("PUT", f"/api/v1/departments/{_q(name)}/burst", json=body.model_dump(mode="json")).json()
        )

    # -- single sign-on (no token needed) -------------------------------------------------------------------
    def sso_config(self) -> SsoConfig:
        return self._get(SsoConfig, "/api/v1/sso/config")

    def sso_device_begin(self) -> DeviceStart:
        return self._send(DeviceStart, "POST", "/api/v1/sso/device")

    def sso_device_poll(self, handle: str) -> LoginResponse | DevicePending:
        """One poll: the session once approved, DevicePending (wait its interval) before. ApiError 403 when
        refused, 410 when the code expired."""
        resp = self._call("POST", f"/api/v1/sso/device/{_q(handle)}")
        if resp.status_code == 202:
            return DevicePending.model_validate(resp.json())
        return LoginResponse.model_validate(resp.json())


def _project(project: str | None) -> dict[str, str]:
    return {"project": project} if project else {}
