"""One validated Settings object, built by an entry point (the server command, a test) and passed down."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from sqlalchemy import make_url
from sqlalchemy.exc import ArgumentError


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "gpupool"


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    data_dir: Path = Field(default_factory=default_data_dir)
    db_url: str | None = None
    """SQLAlchemy URL, without a password; None: SQLite in data_dir."""
    db_password: SecretStr | None = None
    """The database password (from the environment or a file, never a command line), put into the URL in memory."""
    host: str = "127.0.0.1"
    port: int = Field(8470, ge=0, le=65535)
    tls_cert: Path | None = None
    """PEM certificate (chain) to serve HTTPS with; tls_key goes with it."""
    tls_key: Path | None = None
    insecure_http: bool = False
    """Allow plain HTTP on an address other than loopback (TLS ends in front of the server, say)."""
    backend: Literal["local", "kubernetes"] = "local"
    kubeconfig: str | None = None
    """For the kubernetes backend; None: the in-cluster configuration."""
    pool_label: str = "gpupool.io/pool"
    """The node label whose value names a node's pool (kubernetes)."""
    namespace_prefix: str = "gpupool-"
    default_image: str = "python:3.12-slim"
    gpus: str = "auto"
    """'auto' (NVML, else simulated), 'nvml', or 'fake:<count>x<model>-<memory GB>[,...]'."""
    pool: str = "default"
    node_name: str | None = None
    interval_s: float = Field(2.0, gt=0)
    """The loop also runs on every submit, cancel and process exit; this is the longest it waits."""
    grace_s: float = Field(30.0, ge=0)
    """Default time between SIGTERM and SIGKILL when a workload is evicted or cancelled."""
    telemetry_interval_s: float = Field(5.0, gt=0)
    """How often GPU activity is sampled and usage charged."""
    prices: dict[str, float] = Field(default_factory=dict)
    """Price of one GPU-hour per pool, for cost reports (a pool without one costs 0)."""
    min_runtime_s: dict[str, float] | None = None
    """Per priority class, overriding the class defaults (e.g. {'training': 0})."""
    single_user: bool = False
    """Run every local workload as the server's own user, with no isolation between tenants. Without it the
    server refuses to start where it cannot give each project an OS identity of its own."""
    uid_base: int = Field(1_900_000_000, ge=100_000, le=2**31 - 2**24)
    """Project p's workloads run as uid uid_base + p (local backend, not single-user)."""
    app_recheck_s: float = Field(30.0, gt=0, le=60)
    """How often an open app websocket's caller is authorised again: a removed member loses it within this."""
    public_url: str | None = Field(None, max_length=512, pattern=r"^https?://[^\s/?#]+/?$")
    """How users reach this server (for app URLs, the single sign-on callback); None: http://host:port."""
    oidc_issuer: str | None = Field(None, max_length=512)
    """Single sign-on: the OpenID Connect provider's issuer URL; None: no single sign-on."""
    oidc_client_id: str | None = Field(None, max_length=255)
    oidc_client_secret: SecretStr | None = None
    """From a file (mode 600), never a command line; None: a public client (PKCE alone)."""
    oidc_roles: tuple[str, ...] = ()
    """GROUP=admin, GROUP=department:NAME:ROLE or GROUP=project:NAME:ROLE (gpupool.services.oidc_roles)."""
    oidc_groups_claim: str = Field("groups", min_length=1, max_length=255)

    @model_validator(mode="after")
    def _edges(self) -> Settings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together: give both, or neither")
        if not self.tls and not self.insecure_http and not loopback(self.host):
            raise ValueError(
                f"--host {self.host}: refusing to serve plain HTTP beyond this machine (tokens would cross the "
                "network in clear). Give --tls-cert and --tls-key, or --insecure-http where TLS ends in front "
                "of the server"
            )
        if self.db_url is not None:
            check_db_url(self.db_url)
            if self.db_password is not None and make_url(self.db_url).get_backend_name() == "sqlite":
                raise ValueError("a database password was given, but the store is SQLite, which takes none")
        elif self.db_password is not None:
            raise ValueError("a database password was given without --db: the default store is SQLite")
        if (self.oidc_issuer is None) != (self.oidc_client_id is None):
            raise ValueError("--oidc-issuer and --oidc-client-id go together: give both, or neither")
        if self.oidc_issuer is None and (self.oidc_client_secret is not None or self.oidc_roles):
            raise ValueError("--oidc-client-secret-file and --oidc-role need --oidc-issuer and --oidc-client-id")
        return self

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None and self.tls_key is not None

    @property
    def public_base_url(self) -> str:
        scheme = "https" if self.tls else "http"
        return (self.public_url or f"{scheme}://{self.host}:{self.port}").rstrip("/")

    @property
    def sso_redirect_uri(self) -> str:
        return f"{self.public_base_url}/api/v1/sso/callback"

    @property
    def database_url(self) -> str:
        """The URL to connect with, the password included: keep it out of logs and messages."""
        if self.db_url is None:
            return f"sqlite:///{self.data_dir / 'gpupool.db'}"
        if self.db_password is None:
            return self.db_url
        url = make_url(self.db_url).set(password=self.db_password.get_secret_value())
        return url.render_as_string(hide_password=False)


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def check_db_url(url: str) -> None:
    """A database URL must not carry a password: a command line is visible to every user of the host (ps,
    /proc/<pid>/cmdline) and stays in shell history."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ValueError("--db: not a database URL; expected postgresql://user@host/dbname or sqlite:///path") from None
    if parsed.password or "password" in parsed.query:
        raise ValueError(
            "--db must not contain a password (a command line is visible to every user of the host): put it in "
            "the environment variable GPUPOOL_DB_PASSWORD, or in a file only you can read (mode 600) and give "
            "--db-password-file PATH"
        )
