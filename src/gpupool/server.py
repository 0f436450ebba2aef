"""Assembling a server from Settings: store, backend, scheduler loop, API. The `gpupool server` entry point."""

from __future__ import annotations

import logging
import os
import ssl
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from sqlalchemy import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess

from gpupool import spokes
from gpupool.api.app import create_app
from gpupool.api.deps import Context
from gpupool.api.tracing import setup_tracing
from gpupool.backends.base import Backend
from gpupool.backends.local import GpuSpecError, discover, uidrange
from gpupool.backends.local.sandbox import Isolation, SandboxError, probe
from gpupool.control.burst import Bursting
from gpupool.control.burst_follow import kube_provider
from gpupool.control.controller import Controller
from gpupool.control.leader import LeaderBackend, Leadership
from gpupool.logs import configure_logging
from gpupool.models.schemas import WorkloadCreate, WorkloadPublic
from gpupool.services import apps, workloads
from gpupool.services.auth import Principal, PrincipalCache
from gpupool.services.oidc import OidcClient, OidcConfig, RoleMap
from gpupool.services.sessions import first_admin, session_key
from gpupool.services.sso import Sso
from gpupool.services.sweep_driver import Submit, SweepDriver
from gpupool.services.sweeps import Studies
from gpupool.settings import Settings
from gpupool.store.engine import make_engine, migrate, session_factory
from gpupool.store.leases import WakeChannel

log = logging.getLogger("gpupool.server")


class StartupError(Exception):
    """A setting the server cannot start with (a bad GPU spec, say); the message says which and why."""


def keep_admin_token(data_dir: Path, token: str | None) -> Path | None:
    """The first admin's token in the data dir (mode 600) while the first start waits for it; the file goes
    once the first start is over."""
    path = data_dir / "admin-token"
    if token is None:
        path.unlink(missing_ok=True)
        return None
    if _read(path) != token:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        os.chmod(path, 0o600)
    return path


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def store_state(settings: Settings, sessions: sessionmaker[Session]) -> tuple[bytes, str | None]:
    """The session key (the setting's, else the store's) and the first admin's token file, if this server
    keeps one. A key from a data dir of before goes into the store, if the store has none yet, and the file
    goes: the store is where every server reads it."""
    legacy = settings.data_dir / "session-secret"
    with sessions() as s:
        key = session_key(s, _read(legacy))
        token = first_admin(s, _read(settings.data_dir / "admin-token"))
    legacy.unlink(missing_ok=True)
    if settings.session_secret is not None:
        key = settings.session_secret.get_secret_value().encode()
    path = keep_admin_token(settings.data_dir, token)
    return key, None if path is None else str(path)


_CLAIMS: dict[Path, int] = {}
"""This process's claims on its uid range (uidrange.py), by data dir: held open for its life."""


def isolation(settings: Settings) -> Isolation:
    try:
        found = probe(settings.single_user)
        if found.sandboxed and settings.data_dir not in _CLAIMS:
            _CLAIMS[settings.data_dir] = uidrange.claim(settings.data_dir, settings.uid_base)
        return found
    except (SandboxError, uidrange.RangeTaken) as e:
        raise StartupError(str(e)) from None
    except OSError as e:
        raise StartupError(f"the host's registry of uid ranges ({uidrange.REGISTRY}) cannot be used: {e}") from None


def role_map(settings: Settings) -> RoleMap:
    try:
        return RoleMap.parse(settings.oidc_roles)
    except ValueError as e:
        raise StartupError(f"--oidc-role {e}") from None


def single_sign_on(settings: Settings) -> tuple[OidcConfig, RoleMap] | None:
    """The provider's configuration (its client reaches the provider only at the first login) and the role map;
    None when --oidc-issuer is not given."""
    if settings.oidc_issuer is None or settings.oidc_client_id is None:
        return None
    roles = role_map(settings)
    secret = settings.oidc_client_secret
    try:
        config = OidcConfig(
            issuer=settings.oidc_issuer, client_id=settings.oidc_client_id,
            client_secret=None if secret is None else secret.get_secret_value(),
            redirect_uri=settings.sso_redirect_uri, groups_claim=settings.oidc_groups_claim,
        )  # fmt: skip
    except ValueError as e:
        raise StartupError(f"single sign-on: {e}") from None
    if not roles.entries:
        log.warning("single sign-on without --oidc-role: every login will be refused (default deny)")
    return config, roles


def build(settings: Settings) -> tuple[Context, str | None]:
    """Everything a server needs, started except for the HTTP listener and the scheduler loop. Returns the
    context and, while the first start waits for its admin, where this server keeps the admin's token.

    On SQLite the server is the only one and always leads. On PostgreSQL it may be one of several (replicas, or
    --workers): the loop runs only while it holds the store's lease, and nodes are registered and running
    launches adopted when it takes the lease, not here."""
    role_map(settings)  # a bad --oidc-role stops the start before anything is made
    try:
        gpus = discover(settings.gpus)
    except GpuSpecError as e:
        raise StartupError(str(e)) from None
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(settings.data_dir, 0o700)
    oidc = single_sign_on(settings)
    try:
        engine = make_engine(settings.database_url)
    except ValueError as e:  # a setting in the URL the engine does not take (SQLite's synchronous=...)
        raise StartupError(str(e)) from None
    try:
        migrate(engine)
    except OperationalError as e:  # the driver's own words name host, user and reason, never the password
        raise StartupError(
            f"cannot use the store {_redact(settings.database_url)}: {' '.join(str(e.orig).split())}"
        ) from None
    sessions = session_factory(engine)
    key, token_path = store_state(settings, sessions)
    sso = None if oidc is None else Sso(OidcClient(oidc[0]), oidc[1], key)
    holder: list[Controller] = []
    replicated = engine.dialect.name == "postgresql"
    home: Backend

    def nudge() -> None:
        if holder:
            holder[0].loop.nudge()

    def local(data_dir: Path) -> Backend:
        return spokes.local_backend(settings, data_dir, gpus, nudge, isolation(settings), adopt=not replicated)

    if settings.backend == "kubernetes":
        try:
            home = spokes.kube_backend(settings, sessions, nudge, settings.kubeconfig, settings.pool_label)
        except spokes.NoCodeUrl as e:
            raise StartupError(str(e)) from None
    else:
        home = local(settings.data_dir)
    fleet = spokes.fleet(settings, home, sessions, nudge, local)
    fleet.start()
    backend: Backend = fleet
    leadership: Leadership | None = None
    if replicated:
        lease_engine = make_engine(settings.database_url)  # a pool of its own: renewals never queue behind requests
        leadership = Leadership(
            session_factory(lease_engine), ttl_s=settings.lease_ttl_s, wakes=WakeChannel(lease_engine)
        )
        backend = LeaderBackend(backend, leadership)
    controller = Controller(
        sessions,
        backend,
        interval_s=settings.interval_s,
        telemetry_interval_s=settings.telemetry_interval_s,
        workdir_retention_s=settings.workdir_retention_s,
        gang_timeout_s=settings.gang_timeout_s,
        inventory_interval_s=10.0 if settings.backend == "kubernetes" else None,
        fence=None if leadership is None else leadership.fence,
        cluster_down_after_s=settings.cluster_down_after_s,
        bursting=Bursting(kube_provider, settings.burst_interval_s, settings.burst_lookahead_s),
        api_url=settings.code_url or settings.public_base_url,
        mlflow=settings.mlflow_command,
    )
    studies = Studies(settings.database_url)
    driver = SweepDriver(sessions, backend, studies, _trial_submitter(settings, backend), settings.sweep_interval_s)
    controller.after_cycle.append(driver.step)
    holder.append(controller)
    if leadership is None:
        controller.register_nodes()
    else:
        controller.loop.follow(leadership, lambda: take_over(controller, backend))
    principals = PrincipalCache(first_admin_file=settings.data_dir / "admin-token")
    return Context(settings, sessions, backend, controller, principals, sso=sso, studies=studies), token_path


def _trial_submitter(settings: Settings, backend: Backend) -> Submit:
    """A sweep's trials are submitted as its owner's API submits would be, with the server's settings."""

    def submit(session: Session, who: Principal, body: WorkloadCreate, key: str) -> WorkloadPublic:
        return workloads.submit(
            session, who, body, default_grace_s=settings.grace_s, min_runtime_s=settings.min_runtime_s or {},
            notebooks=backend.capabilities().notebooks, idempotency_key=key, allowed_images=settings.allowed_images,
        )[0]  # fmt: skip

    return submit


def take_over(controller: Controller, backend: Backend) -> None:
    """A new term: adopt what runs (the last leader may have launched it) and register this server's nodes."""
    if isinstance(backend, LeaderBackend):
        backend.adopt()
    controller.read_again()
    controller.register_nodes()
    log.info("took over the scheduler: nodes registered, running launches adopted")


def check_tls(settings: Settings) -> None:
    """Load the certificate and key once before anything starts, so a bad pair is a clear error, not a traceback
    (and an encrypted key is refused here rather than prompting for its passphrase)."""
    if settings.tls_cert is None or settings.tls_key is None:
        return
    try:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(settings.tls_cert, settings.tls_key, password=lambda: b"")
    except (OSError, ssl.SSLError) as e:
        pair = f"--tls-cert {settings.tls_cert} / --tls-key {settings.tls_key}"
        raise StartupError(f"{pair}: cannot load them (PEM, key unencrypted): {e}") from None


def serve(settings: Settings, announce: bool = True) -> None:
    configure_logging(settings.log_format, settings.log_level)
    check_tls(settings)
    ctx, token_path = build(settings)
    nodes = ctx.backend.inventory()
    gpus = [d for n in nodes for d in n.devices]
    kind = ctx.backend.capabilities().extra.get("gpus", ctx.backend.capabilities().name)
    if announce:
        models = ", ".join(sorted({f"{sum(1 for x in gpus if x.model == d.model)}× {d.model}" for d in gpus}))
        where = f"{len(nodes)} node(s), " if settings.backend == "kubernetes" else ""
        count = f"{len(gpus)} GPU{'' if len(gpus) == 1 else 's'}"
        print(f"gpupool: {where}{count} ({kind}: {models or 'none'}), store {_redact(settings.database_url)}")
        if token_path:
            print(f"gpupool: first start; the admin token is in {token_path} (readable only by you; removed once used)")
        if settings.backend == "local" and settings.single_user:
            print("gpupool: --single-user: workloads run as this server's user; tenants are NOT isolated")
        elif settings.backend == "local":
            limits = ctx.backend.capabilities().isolation.get("cpu_memory", "advisory")
            print(f"gpupool: workloads sandboxed (a uid per project, bubblewrap); cpu and memory: {limits}")
            if not ctx.backend.capabilities().notebooks:
                print(f"gpupool: notebooks are off: JupyterLab is not installed, or workloads cannot run "
                      f"{sys.executable} (its files must be readable by other users)")  # fmt: skip
        if not settings.tls and settings.insecure_http:
            print(f"gpupool: --insecure-http: plain HTTP on {settings.host}; tokens cross the network in clear "
                  "unless TLS ends in front of this server")  # fmt: skip
        if ctx.sso is not None:
            print(f"gpupool: single sign-on with {settings.oidc_issuer}; {len(ctx.sso.roles.entries)} group "
                  f"mapping(s); callback {settings.sso_redirect_uri}")  # fmt: skip
        scheme = "https" if settings.tls else "http"
        if settings.workers > 1:
            print(f"gpupool: {settings.workers} API workers; the scheduler runs in the one holding the store's lease")
        print(apps.startup_note(settings))
        print(f"gpupool: API on {scheme}://{settings.host}:{settings.port}  (docs at /docs)", flush=True)
    if settings.workers > 1:
        serve_workers(settings)  # each worker builds its own context; this one was for the checks and the words
        return
    ctx.controller.start()
    try:
        app = create_app(ctx)
        setup_tracing(app)
        uvicorn.run(
            app, host=settings.host, port=settings.port, log_level="warning", access_log=False, log_config=None,
            ssl_certfile=settings.tls_cert, ssl_keyfile=settings.tls_key,
        )  # fmt: skip
    finally:
        ctx.controller.stop()


_worker_settings: Settings | None = None
"""A worker's settings: they come in its WorkerConfig, over the pipe that starts it (never the environment,
which would show a database password to whoever reads /proc)."""


class WorkerConfig(uvicorn.Config):
    """uvicorn's configuration for --workers: the app is the import string of a factory (each worker process
    imports it afresh), and the settings travel with the configuration to every worker."""

    def __init__(self, settings: Settings, **kwargs: Any) -> None:
        super().__init__("gpupool.server:worker_app", factory=True, **kwargs)
        self.gpupool_settings = settings

    def load(self) -> None:
        global _worker_settings
        _worker_settings = self.gpupool_settings
        super().load()


def serve_workers(settings: Settings) -> None:
    """`settings.workers` processes on one listening socket (PostgreSQL only: Settings refuses SQLite)."""
    config = WorkerConfig(
        settings, host=settings.host, port=settings.port, workers=settings.workers, log_level="warning",
        access_log=False, log_config=None, ssl_certfile=settings.tls_cert, ssl_keyfile=settings.tls_key,
    )  # fmt: skip
    Multiprocess(config, sockets=[config.bind_socket()]).run()


def worker_app() -> ASGIApp:
    """One worker's app: a full context, its scheduler loop started (it runs cycles only while it leads)."""
    settings = _worker_settings
    if settings is None:
        raise RuntimeError("gpupool.server:worker_app is started by `gpupool server --workers N`")
    configure_logging(settings.log_format, settings.log_level)
    try:
        ctx, _ = build(settings)
    except StartupError as e:
        log.error("worker %d cannot start: %s", os.getpid(), e)
        sys.exit(STARTUP_FAILURE)  # the supervisor stops rather than restarting it for ever
    ctx.controller.start()
    app = create_app(ctx)
    setup_tracing(app)
    return StopsWith(app, ctx.controller.stop)


class StopsWith:
    """Runs `on_stop` (in a thread) when the server shuts down, before the app's own shutdown: a worker gives up
    the lease as it goes, so that another takes over at once."""

    def __init__(self, app: ASGIApp, on_stop: Callable[[], None]) -> None:
        self.app = app
        self.on_stop = on_stop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def relay() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                await anyio.to_thread.run_sync(self.on_stop)
            return message

        await self.app(scope, relay, send)


def _redact(url: str) -> str:
    """A database URL fit to print: its password, if any, as ***."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL sqlalchemy reads: show nothing of what might be credentials
        return url.split("://", 1)[0] + "://***" if "@" in url else url
