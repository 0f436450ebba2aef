"""`gpupool server`: everything on embedded defaults."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from gpupool.cli.connection import fail
from gpupool.settings import Settings, default_data_dir


def _numbers(items: list[str] | None, flag: str, form: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items or []:
        key, _, value = item.partition("=")
        try:
            out[key] = float(value)
        except ValueError:
            fail(f"{flag} {item!r}: expected {form}", 2)
    return out


def server(
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="Store, logs and workdirs.")] = None,
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
    host: Annotated[
        str, typer.Option("--host", help="Beyond loopback only with TLS, or --insecure-http.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 8470,
    tls_cert: Annotated[Path | None, typer.Option("--tls-cert", help="PEM certificate: serve HTTPS.")] = None,
    tls_key: Annotated[Path | None, typer.Option("--tls-key", help="PEM private key of --tls-cert.")] = None,
    insecure_http: Annotated[
        bool,
        typer.Option("--insecure-http", help="Serve plain HTTP on a non-loopback --host (TLS ends in front of it)."),
    ] = False,
    backend: Annotated[str, typer.Option("--backend", help="local (this host) or kubernetes.")] = "local",
    kubeconfig: Annotated[
        str | None, typer.Option("--kubeconfig", help="For --backend kubernetes; default: in-cluster config.")
    ] = None,
    pool_label: Annotated[
        str, typer.Option("--pool-label", help="Node label naming a node's pool.")
    ] = "gpupool.io/pool",
    image: Annotated[str, typer.Option("--image", help="Default container image (kubernetes).")] = "python:3.12-slim",
    gpus: Annotated[str, typer.Option("--gpus", help="auto, nvml, or fake:<count>x<model>-<memory GB>[,...]")] = "auto",
    pool: Annotated[str, typer.Option("--pool", help="The pool this host's GPUs belong to.")] = "default",
    interval: Annotated[float, typer.Option("--interval", help="Longest seconds between scheduling cycles.")] = 2.0,
    grace: Annotated[float, typer.Option("--grace", help="Default seconds from SIGTERM to SIGKILL.")] = 30.0,
    telemetry: Annotated[float, typer.Option("--telemetry-interval", help="Seconds between GPU samples.")] = 5.0,
    price: Annotated[
        list[str] | None, typer.Option("--price", help="POOL=PRICE of one GPU-hour, for cost reports (repeatable).")
    ] = None,
    min_runtime: Annotated[
        list[str] | None, typer.Option("--min-runtime", help="CLASS=SECONDS, overriding a class's minimum runtime.")
    ] = None,
    single_user: Annotated[
        bool,
        typer.Option(
            "--single-user",
            help="Run workloads as this server's user, with NO isolation between tenants (one person's machine).",
        ),
    ] = False,
    uid_base: Annotated[
        int, typer.Option("--uid-base", help="Project p's workloads run as uid (and gid) UID_BASE + p.")
    ] = 1_900_000_000,
    public_url: Annotated[
        str | None, typer.Option("--public-url", help="How users reach this server, e.g. https://gpu.example.org.")
    ] = None,
    app_recheck: Annotated[
        float, typer.Option("--app-recheck", help="Seconds between re-checks of an open app connection's rights.")
    ] = 30.0,
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
    ] = "groups",
) -> None:
    """Start gpupool: API on 127.0.0.1:8470, scheduler, local backend, SQLite store."""
    from gpupool.server import StartupError, serve

    overrides = _numbers(min_runtime, "--min-runtime", "CLASS=SECONDS")
    prices = _numbers(price, "--price", "POOL=PRICE, e.g. default=2.50")
    if db is not None and not db.startswith(("postgresql://", "postgresql+psycopg://", "sqlite:///")):
        fail("--db: expected postgresql://user@host/dbname or sqlite:///path", 2)  # echoing it could show a password
    password = _db_password(db_password_file)
    oidc_secret = None
    if oidc_client_secret_file is not None:
        oidc_secret = _secret_file(oidc_client_secret_file, "--oidc-client-secret-file")
    try:
        settings = Settings(
            data_dir=data_dir or default_data_dir(), db_url=db, db_password=password, backend=backend,
            kubeconfig=kubeconfig, pool_label=pool_label, default_image=image, host=host, port=port,
            tls_cert=tls_cert, tls_key=tls_key, insecure_http=insecure_http, gpus=gpus, pool=pool,
            interval_s=interval, grace_s=grace, min_runtime_s=overrides or None, telemetry_interval_s=telemetry,
            prices=prices, single_user=single_user, uid_base=uid_base, public_url=public_url,
            app_recheck_s=app_recheck, oidc_issuer=oidc_issuer, oidc_client_id=oidc_client_id,
            oidc_client_secret=oidc_secret, oidc_roles=tuple(oidc_role or ()), oidc_groups_claim=oidc_groups_claim,
        )  # fmt: skip
    except ValidationError as e:
        # The messages only: pydantic's own text would echo the input, a database URL included.
        fail("; ".join(_message(err) for err in e.errors()), 2)
    try:
        serve(settings)
    except StartupError as e:
        fail(str(e), 2)


def _message(err: ErrorDetails) -> str:
    msg = str(err["msg"]).removeprefix("Value error, ")
    loc = ".".join(str(part) for part in err.get("loc", ()))
    return f"{loc}: {msg}" if loc else msg


def _db_password(path: Path | None) -> str | None:
    """From GPUPOOL_DB_PASSWORD or a file only its owner can read; taken out of the environment, so nothing this
    server starts inherits it."""
    from_env = os.environ.pop("GPUPOOL_DB_PASSWORD", None) or None
    if path is None:
        return from_env
    if from_env is not None:
        fail("the database password is given twice: set GPUPOOL_DB_PASSWORD or give --db-password-file, not both", 2)
    return _secret_file(path, "--db-password-file")


def _secret_file(path: Path, flag: str) -> str:
    """A secret from a file only its owner can read (its first line's end stripped)."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            fail(f"{flag} {path}: mode {mode:o} lets others read it; chmod 600 it", 2)
        text = path.read_text().rstrip("\r\n")
    except OSError as e:
        fail(f"{flag} {path}: {e.strerror}", 2)
    if not text:
        fail(f"{flag} {path}: the file is empty", 2)
    return text
