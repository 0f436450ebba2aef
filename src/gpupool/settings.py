"""One validated Settings object, built by an entry point (the server command, a test) and passed down.

Where a value comes from, strongest first: flags (what the entry point passes in), the environment
(GPUPOOL_<NAME>), the secrets dir (secrets only, a file per secret), the config file (YAML or TOML, named by
--config or GPUPOOL_CONFIG), then the defaults below. A config file's keys and the environment's names are the
field names here (db_url, interval_s, ...)."""

from __future__ import annotations

import ipaddress
import os
import stat
import tomllib
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SecretsSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
    YamlConfigSettingsSource,
)
from sqlalchemy import make_url
from sqlalchemy.exc import ArgumentError

SECRETS = {
    "db_password": "the database password",
    "oidc_client_secret": "the OpenID Connect client secret",
    "session_secret": "the session secret",
}
"""The settings that are secrets: each may come from `<name>_file`, or a file `<name>` in the secrets dir."""


class ConfigError(ValueError):
    """A config file, secrets dir or secret file that cannot be used; the message says which and why."""


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "gpupool"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(frozen=True, extra="forbid", env_prefix="GPUPOOL_", env_ignore_empty=True)

    config: Path | None = None
    """A YAML (.yaml, .yml) or TOML (.toml) file of settings, keyed by these fields' names."""
    secrets_dir: Path | None = None
    """A directory holding secrets as files named for them (db_password, oidc_client_secret, session_secret), as
    a Kubernetes Secret volume or Docker secrets lay them out."""
    data_dir: Path = Field(default_factory=default_data_dir)
    db_url: str | None = None
    """SQLAlchemy URL, without a password; None: SQLite in data_dir."""
    db_password: SecretStr | None = None
    """The database password (never a command line), put into the URL in memory."""
    db_password_file: Path | None = None
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
    scheduler_name: str = Field("gpupool", min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    """The `spec.schedulerName` gpupool serves (kubernetes): a pod naming it, with a project, is a workload gpupool
    schedules and binds; gpupool's own pods name it too."""
    gang_timeout_s: float = Field(600.0, gt=0)
    """How long some pods of a gang (kubernetes: a Job's, a JobSet's, a PodGroup's) may wait for the rest before their
    condition says the gang is overdue. None of them is placed until all exist, however long that takes."""
    cluster_name: str = Field("home", min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """The name of this server's own cluster (its backend's nodes) among the clusters it schedules."""
    cluster_heartbeat_s: float = Field(2.0, gt=0, le=60)
    """How often each spoke (`gpupool cluster add`) is reached, to read its nodes and tell it is there."""
    cluster_down_after_s: float = Field(30.0, gt=0, le=3600)
    """A spoke not reached for this long is down: it takes no new work, and its workloads follow their policy."""
    sweep_interval_s: float = Field(1.0, gt=0, le=600)
    """How often the leader reads its sweeps' trials' reports and asks their studies for more trials."""
    burst_interval_s: float = Field(10.0, gt=0, le=600)
    """How often the hub follows its burst nodes with their providers and decides what to rent or give back."""
    burst_lookahead_s: float = Field(3600.0, gt=0, le=30 * 86400)
    """A node is rented only if the department's budget covers every node it holds for this long, the new one too."""
    default_image: str = "python:3.12-slim"
    mlflow_command: str = Field("mlflow", min_length=1, max_length=512)
    """The `mlflow` that serves an inference workload's --model: a path on the hosts (local backend), or a name on
    the image's PATH (kubernetes)."""
    gpus: str = "auto"
    """'auto' (NVML, else simulated), 'nvml', or 'fake:<count>x<model>-<memory GB>[,...]'."""
    pool: str = "default"
    node_name: str | None = None
    workers: int = Field(1, ge=1, le=64)
    """API worker processes (PostgreSQL only). Each serves the API; the scheduler loop runs in the one that holds
    the store's lease."""
    lease_ttl_s: float = Field(10.0, ge=2, le=300)
    """PostgreSQL: how long the leader's lease lasts unrenewed. It is renewed every fifth of this; a standby takes
    over within about 1.1 times this of the leader's death, and a leader that cannot renew stops acting after
    four fifths of it."""
    interval_s: float = Field(2.0, gt=0)
    """The loop also runs on every submit, cancel and process exit; this is the longest it waits."""
    grace_s: float = Field(30.0, ge=0)
    """Default time between SIGTERM and SIGKILL when a workload is evicted or cancelled."""
    max_code_mib: int = Field(100, ge=1, le=10_240)
    """The largest code tree (MiB) a workload may take with it; the client checks it before uploading."""
    allowed_images: list[str] = Field(default_factory=lambda: ["*"], max_length=256)
    """The images workloads may name, as shell-style patterns (`ghcr.io/acme/*`, `python:3.*`), matched against the
    name as given and as Docker expands it (`python:3.12` is `docker.io/library/python:3.12`). `*` allows any; a
    workload without an image (the server's environments, the Kubernetes backend's default image) is not asked."""
    code_quota_mib: int = Field(2048, ge=1, le=1_048_576)
    """The most code (MiB) one project keeps uploaded: what its workloads name, and uploads of the last day that no
    workload names yet (collected after that). Uploads past it get 413: one project cannot fill the store's disk."""
    workdir_retention_s: float = Field(7 * 86400, ge=0)
    """How long a finished workload's working directory is kept (for `gpupool cp`) before the leader removes it;
    its logs stay. Volumes are never collected."""
    max_volume_gib: int = Field(10 * 1024, ge=1)
    """The largest project volume (GiB) a member may create."""
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
    pids_limit: int = Field(4096, ge=64, le=4_194_304)
    """The most processes and threads one member of a workload may have at once (local backend, sandboxed: a pids
    cgroup or systemd's TasksMax), so that a fork bomb stops at its own limit and not at the host's pid_max."""
    app_recheck_s: float = Field(30.0, gt=0, le=60)
    """How often an open app websocket's or a followed log's caller is authorised again: a removed member loses
    it within this."""
    log_format: Literal["text", "json"] = "text"
    """JSON lines (one object per line, with the cycle id) for a log collector; text for people."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    public_url: str | None = Field(None, max_length=512, pattern=r"^https?://[^\s/?#]+/?$")
    """How users reach this server (for app URLs, the single sign-on callback); None: http://host:port."""
    code_url: str | None = Field(None, max_length=512, pattern=r"^https?://[^\s/?#]+/?$")
    """Kubernetes: the API as the pods reach it, where a pod's init step fetches its workload's code (an in-cluster
    Service's URL, say); None: the public URL."""
    code_image: str | None = Field(None, max_length=512, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$")
    """Kubernetes: the image of a pod's code-fetching init step (any with gpupool's client); None: the server's."""
    apps_url: str | None = Field(None, max_length=512, pattern=r"^https?://[^\s/?#]+/?$")
    """Where notebooks and inference services are served (/apps/...), on an origin of their own so that a tenant's
    page cannot call the API as the user viewing it (as JupyterHub's subdomain_host): a host name that is not
    the portal's (`http://apps.localhost:8470`, `https://apps.gpu.example.com`) and reaches this server. None:
    apps share the portal's origin (one person's machine, or trusted tenants only)."""
    oidc_issuer: str | None = Field(None, max_length=512)
    """Single sign-on: the OpenID Connect provider's issuer URL; None: no single sign-on."""
    oidc_client_id: str | None = Field(None, max_length=255)
    oidc_client_secret: SecretStr | None = None
    """None: a public client (PKCE alone)."""
    oidc_client_secret_file: Path | None = None
    oidc_roles: tuple[str, ...] = ()
    """GROUP=admin, GROUP=department:NAME:ROLE or GROUP=project:NAME:ROLE (gpupool.services.oidc_roles)."""
    oidc_groups_claim: str = Field("groups", min_length=1, max_length=255)
    session_secret: SecretStr | None = None
    """The key that signs the values a browser keeps between the halves of a single sign-on. None: the one
    the store made on first start, shared by every server on the store; set it to pin (or rotate) it."""
    session_secret_file: Path | None = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        given = init_settings.init_kwargs if isinstance(init_settings, InitSettingsSource) else {}
        path = given.get("config") or os.environ.get("GPUPOOL_CONFIG") or None
        file = config_file(settings_cls, Path(path)) if path is not None else None
        secrets_dir = (
            given.get("secrets_dir")
            or os.environ.get("GPUPOOL_SECRETS_DIR")
            or (file.init_kwargs.get("secrets_dir") if file is not None else None)
        )
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if secrets_dir:
            sources.append(SecretFiles(settings_cls, Path(secrets_dir)))
        if file is not None:
            sources.append(file)
        return tuple(sources)

    @model_validator(mode="before")
    @classmethod
    def _secret_files(cls, data: Any) -> Any:
        """A secret's `<name>_file` becomes the secret; given both ways is an error (which would win is a guess)."""
        if not isinstance(data, dict):
            return data
        for name, what in SECRETS.items():
            path = data.get(f"{name}_file")
            if path is None:
                continue
            flag = f"--{name.replace('_', '-')}-file"
            if data.get(name) is not None:  # from the environment, the secrets dir or a config file
                raise ValueError(f"{what} is given twice: set GPUPOOL_{name.upper()} or give {flag}, not both")
            data = {**data, name: read_secret_file(Path(path), f"{flag} {path}")}
        return data

    @field_validator("session_secret")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not 32 <= len(value.get_secret_value()) <= 1024:
            raise ValueError("a session secret has 32 to 1024 characters")
        return value

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
        sqlite_store = self.db_url is None or make_url(self.db_url).get_backend_name() == "sqlite"
        if self.workers > 1 and sqlite_store:
            raise ValueError(
                f"--workers {self.workers} needs PostgreSQL (--db postgresql://...): SQLite has one writer at a time "
                "and one server per file, so run one worker on it"
            )
        if self.db_url is not None:
            check_db_url(self.db_url)
            if self.db_password is not None and make_url(self.db_url).get_backend_name() == "sqlite":
                raise ValueError("a database password was given, but the store is SQLite, which takes none")
        elif self.db_password is not None:
            raise ValueError("a database password was given without --db: the default store is SQLite")
        if self.apps_url is not None:
            apps_host = urlsplit(self.apps_url).hostname
            if apps_host == urlsplit(self.public_base_url).hostname:
                # Cookies are shared across ports, so only another host name is another origin for them.
                raise ValueError(
                    f"apps_url {self.apps_url}: its host must differ from the portal's ({apps_host}), not just its "
                    "port: give apps a name of their own (apps.localhost, apps.gpu.example.com)"
                )
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


def config_file(settings_cls: type[BaseSettings], path: Path) -> InitSettingsSource:
    """The settings in a YAML or TOML file. A file that holds a secret must be readable by its owner alone."""
    where = f"config file {path}"
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".toml"):
        raise ConfigError(f"{where}: name it .yaml, .yml or .toml (its suffix says how to read it)")
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        with path.open("rb"):  # readable at all: the sources below would skip a missing file silently
            pass
    except OSError as e:
        raise ConfigError(f"{where}: {e.strerror}") from None
    source: InitSettingsSource
    try:
        if suffix == ".toml":
            source = TomlConfigSettingsSource(settings_cls, toml_file=path)
            data: object = source.toml_data
        else:
            source = YamlConfigSettingsSource(settings_cls, yaml_file=path)
            data = source.yaml_data
    except (yaml.YAMLError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: not valid {'TOML' if suffix == '.toml' else 'YAML'}: {_first_line(e)}") from None
    except (ValueError, TypeError, AttributeError):  # the source takes the top for a mapping
        data = None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of setting names to values at the top")
    if "config" in data:
        raise ConfigError(f"{where}: a config file cannot name another (config)")
    held = sorted(k for k in data if k in SECRETS)
    if held and mode & 0o077:
        raise ConfigError(f"{where}: holds {', '.join(held)} but mode {mode:o} lets others read it; chmod 600 it")
    return source


class SecretFiles(SecretsSettingsSource):
    """The secrets dir: only the secrets are read from it, each a file named for its setting, which other users
    may not read (its group may: a container platform mounts secrets group-readable for the pod's fsGroup)."""

    def __init__(self, settings_cls: type[BaseSettings], directory: Path) -> None:
        super().__init__(settings_cls, secrets_dir=directory, env_prefix="", case_sensitive=True)
        self.directory = directory

    def __call__(self) -> dict[str, Any]:
        if not self.directory.is_dir():  # the library only warns
            raise ConfigError(f"secrets_dir {self.directory}: not a directory")
        return super().__call__()

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        if field_name not in SECRETS:
            return None, field_name, False
        value, key, complex_ = super().get_field_value(field, field_name)
        if value is not None:
            path = self.directory / field_name
            mode = stat.S_IMODE(path.stat().st_mode)
            if mode & 0o007:
                raise ConfigError(f"secrets_dir {path}: mode {mode:o} lets every user read it; chmod o-rwx it")
            if not value:
                raise ConfigError(f"secrets_dir {path}: the file is empty")
        return value, key, complex_


def read_secret_file(path: Path, what: str) -> str:
    """A secret from a file only its owner can read (its first line's end stripped)."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise ConfigError(f"{what}: mode {mode:o} lets others read it; chmod 600 it")
        text = path.read_text().rstrip("\r\n")
    except OSError as e:
        raise ConfigError(f"{what}: {e.strerror}") from None
    if not text:
        raise ConfigError(f"{what}: the file is empty")
    return text


def _first_line(e: Exception) -> str:
    return " ".join(str(e).split())[:300]


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
    if not url.startswith(("postgresql://", "postgresql+psycopg://", "sqlite:///")):
        raise ValueError("--db: expected postgresql://user@host/dbname or sqlite:///path")  # not echoed: a password?
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
