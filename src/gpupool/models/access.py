"""Wire models of access: tokens, memberships and the audit trail. Like schemas.py, they depend on pydantic only
(the client and the CLI import them), refuse unknown fields on input and declare their limits here."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpupool.models.wire import Name, Reply, Wire

TokenKind = Literal["personal", "service", "session", "apikey", "metrics"]
MemberRole = Literal["member", "viewer", "admin"]


class TokenCreate(Wire):
    name: Name
    kind: Literal["personal", "service", "apikey", "metrics"] = "personal"
    """metrics: Prometheus's scrape token (admins only): it reads /metrics and nothing else."""
    project: Name | None = None
    """Personal: optional, narrows the token to one project. Service and apikey: the project they belong to."""
    role: Literal["member", "viewer"] | None = None
    """The most the token may do; never more than its creator. None: what its user may (a service: member)."""
    app: Name | None = None
    """For an apikey: the inference service it opens."""
    expires_in_days: int = Field(90, ge=1, le=365)


class TokenPublic(Reply):
    id: int
    name: str
    kind: TokenKind
    user: str
    project: str | None = None
    role: str | None = None
    app: str | None = None
    created_at: float
    expires_at: float | None = None
    revoked_at: float | None = None
    last_used_at: float | None = None


class TokenCreated(TokenPublic):
    token: str
    """Shown once; the server keeps only its hash."""


class MemberSet(Wire):
    role: MemberRole = "member"


class MemberPublic(Reply):
    user: str
    queue: str
    role: MemberRole


class AuditPublic(Reply):
    id: int
    at: float
    request_id: str
    actor: str | None
    role: str | None
    tenant: str | None
    department: str | None
    object: str
    action: str
    status: int
    address: str | None


class ProjectSettings(Wire):
    production_allowed: bool | None = None
    """Whether members may submit at production priority."""
    pod_security: Literal["restricted", "baseline"] | None = None
    """How its pods run on Kubernetes (admins only)."""
    host_network: bool | None = None
    """Its local workloads share the host's network instead of one each (admins only)."""
    mlflow_uri: str | None = Field(None, max_length=512, pattern=r"^(https?://[^\s?#]+)?$")
    """Its MLflow tracking server, for the workloads submitted from now on; "" removes it."""


class SecretSet(Wire):
    value: str = Field(max_length=32_768)


class SecretPublic(Reply):
    """A secret's name and who set it when: its value is never shown back."""

    name: str
    project: str
    updated_at: float
    updated_by: str
