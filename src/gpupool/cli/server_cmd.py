"""`gpupool server`: everything on embedded defaults; flags over the environment (GPUPOOL_*), the secrets dir and
a config file (see gpupool.settings)."""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from pydantic_core import ErrorDetails
from pydantic_settings import SettingsError

from gpupool.cli.connection import fail
from gpupool.durations import duration_flag
from gpupool.settings import SECRETS, ConfigError, Settings

FIELDS = {
    "config": "config", "secrets_dir": "secrets_dir", "data_dir": "data_dir", "db": "db_url",
    "db_password_file": "db_password_file", "host": "host", "port": "port", "tls_cert": "tls_cert",
    "tls_key": "tls_key", "insecure_http": "insecure_http", "backend": "backend", "kubeconfig": "kubeconfig",
    "pool_label": "pool_label", "image": "default_image", "gpus": "gpus", "pool": "pool", "interval": "interval_s",
    "grace": "grace_s", "telemetry_interval": "telemetry_interval_s", "price": "prices", "min_runtime": "min_runtime_s",
    "single_user": "single_user", "uid_base": "uid_base", "pids_limit": "pids_limit", "public_url": "public_url",
    "app_recheck": "app_recheck_s",
    "log_format": "log_format", "log_level": "log_level", "workers": "workers", "lease_ttl": "lease_ttl_s",
    "oidc_issuer": "oidc_issuer", "oidc_client_id": "oidc_client_id",
    "oidc_client_secret_file": "oidc_client_secret_file", "oidc_role": "oidc_roles",
    "oidc_groups_claim": "oidc_groups_claim", "session_secret_file": "session_secret_file",
}  # fmt: skip
"""This command's parameters → the settings they set."""


def _default(field: str) -> Any:
    """The setting's default, so --help shows the one Settings uses."""
    return Settings.model_fields[field].default


def _numbers(items: list[str], flag: str, form: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        key, _, value = item.partition("=")
        try:
            out[key] = float(value)
        except ValueError:
            fail(f"{flag} {item!r}: expected {form}", 2)
    return out


def server(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option("--config", help="A YAML or TOML file of settings (or GPUPOOL_CONFIG); flags override it."),
    ] = None,
    secrets_dir: Annotated[
        Path | None,
        typer.Option(
            "--secrets-dir",
            help="A directory of secret files: db_password, oidc_client_secret, "
            "session_secret (or GPUPOOL_SECRETS_DIR).",
        ),
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", help="Store, logs and workdirs (default: ~/.local/share/gpupool).")
    ] = None,
    db: Annotated[
        str | None,
        typer.Option("--db", help="postgresql://user@host/db, no password (default: SQLite in the data dir)."),
    ] = None,
    db_password_file: Annotated[
        Path | None,
        typer.Option(
            "--db-password-file",
            help="A file (mode 600) holding the database password; or set GPUPOOL_DB_PASSWORD.",
        ),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Beyond loopback only with TLS, or --insecure-http.")] = _default(
        "host"
    ),
    port: Annotated[int, typer.Option("--port")] = _default("port"),
    tls_cert: Annotated[Path | None, typer.Option("--tls-cert", help="PEM certificate: serve HTTPS.")] = None,
    tls_key: Annotated[Path | None, typer.Option("--tls-key", help="PEM private key of --tls-cert.")] = None,
    insecure_http: Annotated[
        bool,
        typer.Option(
            "--insecure-http/--no-insecure-http",
            help="Serve plain HTTP on a non-loopback --host (TLS ends in front of it).",
        ),
    ] = False,
    backend: Annotated[str, typer.Option("--backend", help="local (this host) or kubernetes.")] = _default("backend"),
    kubeconfig: Annotated[
        str | None, typer.Option("--kubeconfig", help="For --backend kubernetes; default: in-cluster config.")
    ] = None,
    pool_label: Annotated[str, typer.Option("--pool-label", help="Node label naming a node's pool.")] = _default(
        "pool_label"
    ),
    image: Annotated[str, typer.Option("--image", help="Default container image (kubernetes).")] = _default(
        "default_image"
    ),
    gpus: Annotated[
        str, typer.Option("--gpus", help="auto, nvml, or fake:<count>x<model>-<memory GB>[,...]")
    ] = _default("gpus"),
    pool: Annotated[str, typer.Option("--pool", help="The pool this host's GPUs belong to.")] = _default("pool"),
    workers: Annotated[
        int,
        typer.Option(
            "--workers", help="API worker processes (PostgreSQL only); one of them, the lease's holder, schedules."
        ),
    ] = _default("workers"),
    lease_ttl: Annotated[
        float,
        typer.Option(
            "--lease-ttl",
            parser=duration_flag,
            help="How long the leader's lease lasts unrenewed (PostgreSQL), e.g. 15s; a standby takes over after.",
        ),
    ] = _default("lease_ttl_s"),
    interval: Annotated[
        float, typer.Option("--interval", parser=duration_flag, help="Longest time between scheduling cycles, e.g. 2s.")
    ] = _default("interval_s"),
    grace: Annotated[
        float, typer.Option("--grace", parser=duration_flag, help="Default time from SIGTERM to SIGKILL, e.g. 30s.")
    ] = _default("grace_s"),
    telemetry_interval: Annotated[
        float, typer.Option("--telemetry-interval", parser=duration_flag, help="Time between GPU samples, e.g. 10s.")
    ] = _default("telemetry_interval_s"),
    price: Annotated[
        list[str] | None, typer.Option("--price", help="POOL=PRICE of one GPU-hour, for cost reports (repeatable).")
    ] = None,
    min_runtime: Annotated[
        list[str] | None, typer.Option("--min-runtime", help="CLASS=SECONDS, overriding a class's minimum runtime.")
    ] = None,
    single_user: Annotated[
        bool,
        typer.Option(
            "--single-user/--no-single-user",
            help="Run workloads as this server's user, with NO isolation between tenants (one person's machine).",
        ),
    ] = False,
    uid_base: Annotated[
        int, typer.Option("--uid-base", help="Project p's workloads run as uid (and gid) UID_BASE + p.")
    ] = _default("uid_base"),
    pids_limit: Annotated[
        int, typer.Option("--pids-limit", help="The most processes and threads one member of a workload may have.")
    ] = _default("pids_limit"),
    public_url: Annotated[
        str | None, typer.Option("--public-url", help="How users reach this server, e.g. https://gpu.example.org.")
    ] = None,
    app_recheck: Annotated[
        float,
        typer.Option(
            "--app-recheck",
            parser=duration_flag,
            help="Time between re-checks of an open app connection's rights, e.g. 30s.",
        ),
    ] = _default("app_recheck_s"),
    log_format: Annotated[str, typer.Option("--log-format", help="text, or json (lines with the cycle id).")] = (
        _default("log_format")
    ),
    log_level: Annotated[str, typer.Option("--log-level", help="debug, info, warning or error.")] = _default(
        "log_level"
    ),
    oidc_issuer: Annotated[
        str | None, typer.Option("--oidc-issuer", help="Single sign-on: the OpenID Connect provider's issuer URL.")
    ] = None,
    oidc_client_id: Annotated[
        str | None, typer.Option("--oidc-client-id", help="This server's client id at the provider.")
    ] = None,
    oidc_client_secret_file: Annotated[
        Path | None,
        typer.Option("--oidc-client-secret-file", help="A file (mode 600) holding the client secret."),
    ] = None,
    oidc_role: Annotated[
        list[str] | None,
        typer.Option(
            "--oidc-role",
            help="GROUP=admin, GROUP=department:NAME:ROLE or GROUP=project:NAME:ROLE (repeatable); "
            "a login whose groups map to nothing is refused.",
        ),
    ] = None,
    oidc_groups_claim: Annotated[
        str, typer.Option("--oidc-groups-claim", help="The ID token's claim that lists the user's groups.")
    ] = _default("oidc_groups_claim"),
    session_secret_file: Annotated[
        Path | None,
        typer.Option(
            "--session-secret-file",
            help="A file (mode 600) holding the key that signs single sign-on values (default: one the store "
            "makes on first start, shared by every server on it).",
        ),
    ] = None,
) -> None:
    """Start gpupool: API on 127.0.0.1:8470, scheduler, local backend, SQLite store."""
    from gpupool.server import StartupError, serve

    given: dict[str, Any] = {}
    for name, value in ctx.params.items():
        source = ctx.get_parameter_source(name)  # typer's own copy of click's enum: compared by name
        if source is not None and source.name == "COMMANDLINE":
            given[FIELDS[name]] = value
    if price is not None:
        given["prices"] = _numbers(price, "--price", "POOL=PRICE, e.g. default=2.50")
    if min_runtime is not None:
        given["min_runtime_s"] = _numbers(min_runtime, "--min-runtime", "CLASS=SECONDS") or None
    if oidc_role is not None:
        given["oidc_roles"] = tuple(oidc_role)
    settings = load(given)
    try:
        serve(settings)
    except StartupError as e:
        fail(str(e), 2)


def load(given: dict[str, Any]) -> Settings:
    """Settings from the flags `given` and the other sources, or a clear error (exit status 2). A secret read
    from the environment leaves it, so nothing this server starts inherits it."""
    try:
        settings = Settings(**given)
    except ValidationError as e:
        # The messages only: pydantic's own text would echo the input, a database URL or a secret included.
        fail("; ".join(_message(err) for err in e.errors()), 2)
    except ConfigError as e:
        fail(str(e), 2)
    except SettingsError as e:
        fail(_source_message(e), 2)
    for name in list(os.environ):
        if name.upper() in {f"GPUPOOL_{s.upper()}" for s in SECRETS}:
            del os.environ[name]
    return settings


def _message(err: ErrorDetails) -> str:
    msg = str(err["msg"]).removeprefix("Value error, ")
    loc = [str(part) for part in err.get("loc", ())]
    if not loc:
        return msg
    name = loc[0]
    flag = next((f"--{p.replace('_', '-')}" for p, f in FIELDS.items() if f == name), None)
    where = ".".join(loc) + f" ({flag + ', ' if flag else ''}GPUPOOL_{name.upper()})"
    if err["type"] == "extra_forbidden":
        like = difflib.get_close_matches(name, Settings.model_fields, n=1)
        return f"{name}: no such setting" + (f" (did you mean {like[0]}?)" if like else "")
    return f"{where}: {msg}"


def _source_message(e: SettingsError) -> str:
    if isinstance(e.__cause__, ConfigError):
        return str(e.__cause__)
    found = re.search(r'field "(\w+)" from source "(\w+)"', str(e))
    if found is None:
        return str(e)
    name, source = found.groups()
    if source == "EnvSettingsSource":
        return f"GPUPOOL_{name.upper()}: not valid JSON (a list or mapping setting takes JSON in the environment)"
    return f"{name}: cannot be read from {source}"
