"""Who may reach a workload's app (a notebook or an inference service) through the server's proxy, and where.

Apps run their tenant's own script in the browser. On the portal's origin that script could call the API as
whoever views the page, so with `apps_url` set apps live on an origin of their own (JupyterHub's
`subdomain_host`): the apps host never sees the portal's session, and a browser signs in there with a cookie of
that host alone, handed over by a single-use ticket that the portal's host mints for a signed-in caller.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from sqlalchemy import delete, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

from gpupool.lifecycle.phases import STARTED, Phase
from gpupool.services.auth import Principal, hash_token, new_token, principal_for, require_own_login
from gpupool.services.errors import Forbidden, NotFound, ServiceError
from gpupool.settings import Settings
from gpupool.store.tables import AllocationRow, QueueRow, TokenRow, UserRow, WorkloadRow

APP_TYPES = ("notebook", "inference")
SESSION_COOKIE = "gpupool_session"
"""The portal's session (HttpOnly, host-only): read by the API and, where apps share the portal's origin, by
/apps/ on that host; never by the apps host."""


APP_COOKIE = "gpupool_app"
"""The apps host's own session: set by /apps/_auth for one app's path, HttpOnly, never sent to the portal."""
TICKET_PREFIX, APP_SESSION_PREFIX = "gpt_", "gpa_"
TICKET_TTL_S = 30.0
APP_SESSION_TTL_S = 12 * 3600.0
AUTH_PATH = "/apps/_auth"


class NotRunning(ServiceError):
    status = 503


class BadTicket(ServiceError):
    status = 403


class BadNext(ServiceError):
    status = 400


@dataclass(frozen=True, slots=True)
class AppTarget:
    workload_id: int
    project_id: int
    name: str
    kind: str
    alloc_id: str
    port: int | None
    prefix: str
    """The public path the app lives under; notebooks are told it, services see paths below it."""
    app_token: str | None
    """A notebook's own token, which the proxy presents for the callers it has authenticated."""


def resolve(session: Session, who: Principal | None, project: str, name: str) -> AppTarget:
    """The app `name` of `project`, for a caller who may use it: its project's members and admins. Viewers get
    403; callers outside the project, and names that are not apps, get 404 (no hint that they exist). `who`
    None: the caller holds an API key made for this service (checked by `tokens.apikey_opens`)."""
    queue = session.scalar(select(QueueRow).where(QueueRow.name == project, QueueRow.kind == "project"))
    if queue is None or (who is not None and not who.can_read(queue.id)):
        raise NotFound(f"no app {project}/{name}")
    # The live workload of that name: a name is unique among live workloads only (finished ones keep it too).
    row = session.scalar(select(WorkloadRow).where(WorkloadRow.project_id == queue.id, WorkloadRow.live_name == name))
    if row is None or row.type not in APP_TYPES or (who is None and row.type != "inference"):
        raise NotFound(f"no app {project}/{name}")
    if who is not None and not who.can_write(queue.id):
        raise Forbidden(f"your role ({who.role}) cannot open apps of {project!r}")
    alloc = session.scalar(
        select(AllocationRow)
        .where(AllocationRow.workload_id == row.id, AllocationRow.attempt == row.attempt, AllocationRow.member == 0)
        .where(AllocationRow.state.in_(sorted(STARTED)))
    )
    if row.state != Phase.RUNNING or alloc is None:
        raise NotRunning(f"{project}/{name} is {row.state}; it answers once it runs")
    return AppTarget(row.id, queue.id, name, row.type, alloc.id, alloc.port, f"/apps/{project}/{name}/", row.app_token)


def still_allowed(session: Session, who: Principal, workload_id: int) -> bool:
    """For open app connections: the caller may still use this workload's app."""
    row = session.get(WorkloadRow, workload_id)
    return row is not None and who.can_write(row.project_id)


# --- the apps host --------------------------------------------------------------------------------------------


def _host_port(netloc: str, scheme: str) -> tuple[str, int] | None:
    try:
        parts = urlsplit(f"{scheme}://{netloc}")
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not host:
        return None
    return host.rstrip(".").lower(), port or (443 if scheme == "https" else 80)


def on_apps_host(settings: Settings, host_header: str) -> bool:
    """Whether a request's Host names the apps host (where `apps_url` is set)."""
    if settings.apps_url is None:
        return False
    scheme = urlsplit(settings.apps_url).scheme
    want = _host_port(urlsplit(settings.apps_url).netloc, scheme)
    return want is not None and _host_port(host_header, scheme) == want


def apps_base_url(settings: Settings) -> str:
    """Where app URLs point: the apps host, or the portal's own where apps share its origin."""
    return (settings.apps_url or settings.public_base_url).rstrip("/")


def isolation(settings: Settings) -> dict[str, str]:
    """What describe's isolation block says of the origin apps are served from (the backend's `apps` entry says
    who can reach them)."""
    if settings.apps_url is not None:
        return {"app_origin": f"enforced: their own, {apps_base_url(settings)}; an app's page cannot call the API as "
                              "the user viewing it"}  # fmt: skip
    return {"app_origin": "advisory: the portal's; a tenant's app viewed by another user can act as that user "
                          "(set apps_url)"}  # fmt: skip


def startup_note(settings: Settings) -> str:
    """The server's line about where apps are served."""
    if settings.apps_url is not None:
        return f"gpupool: apps (notebooks, inference services) on their own origin, {apps_base_url(settings)}"
    return ("gpupool: apps share the portal's origin: a tenant's app viewed by another user can act as that user; "
            "set apps_url (docs/portal.md) unless every tenant is trusted")  # fmt: skip


def mint_ticket(session: Session, who: Principal, target: AppTarget, now: float | None = None) -> str:
    """A single-use ticket, good for TICKET_TTL_S, that signs `who` in to `target`'s app on the apps host. Only
    for the user's whole identity: the app session it opens is its user's for 12 hours, wider and longer-lived
    than a narrowed token that a portal's cookie might hold (`require_own_login`)."""
    require_own_login(who, "open sessions")
    at = time.time() if now is None else now
    # Spent and stale tickets and app sessions go with each new ticket: the table keeps no trail of them.
    session.execute(
        delete(TokenRow).where(TokenRow.kind.in_(("app_ticket", "app_session")), TokenRow.expires_at < at - 60)
    )
    return _issue(session, "app_ticket", who.id, target.project_id, target.name, at, TICKET_TTL_S)


def _issue(session: Session, kind: str, user_id: int, project_id: int, app: str, at: float, ttl_s: float) -> str:
    token = new_token(TICKET_PREFIX if kind == "app_ticket" else APP_SESSION_PREFIX)
    session.add(TokenRow(
        user_id=user_id, kind=kind, name=kind.replace("_", " "), token_hash=hash_token(token), project_id=project_id,
        app=app, created_at=at, expires_at=at + ttl_s,
    ))  # fmt: skip
    session.commit()
    return token


@dataclass(frozen=True, slots=True)
class AppSession:
    token: str
    prefix: str
    """The app's path, the only one the apps host's cookie is sent to."""
    expires_at: float


def redeem_ticket(session: Session, ticket: str, now: float | None = None) -> AppSession:
    """Spend a ticket (once: a second redeem, here or on another server, fails) for an app session."""
    at = time.time() if now is None else now
    digest = hash_token(ticket)
    spent = session.execute(
        update(TokenRow)
        .where(TokenRow.token_hash == digest, TokenRow.kind == "app_ticket", TokenRow.revoked_at.is_(None))
        .where(TokenRow.expires_at > at)
        .values(revoked_at=at)
    )
    assert isinstance(spent, CursorResult)
    row = session.scalar(select(TokenRow).where(TokenRow.token_hash == digest)) if spent.rowcount == 1 else None
    queue = session.get(QueueRow, row.project_id) if row is not None and row.project_id is not None else None
    if row is None or queue is None or row.app is None:
        session.rollback()
        raise BadTicket("this sign-in link has expired or was used already: open the app again from the portal")
    token = _issue(session, "app_session", row.user_id, queue.id, row.app, at, APP_SESSION_TTL_S)
    return AppSession(token, f"/apps/{queue.name}/{row.app}/", at + APP_SESSION_TTL_S)


def app_session_caller(session: Session, token: str, project: str, name: str) -> Principal | None:
    """The user an apps-host cookie signs in, for the one app it was made for; None otherwise."""
    if not token.startswith(APP_SESSION_PREFIX):
        return None
    row = session.scalar(select(TokenRow).where(TokenRow.token_hash == hash_token(token)))
    if row is None or row.kind != "app_session" or row.revoked_at is not None or row.project_id is None:
        return None
    if row.expires_at is None or row.expires_at <= time.time() or row.app != name:
        return None
    queue, user = session.get(QueueRow, row.project_id), session.get(UserRow, row.user_id)
    if queue is None or queue.name != project or user is None or user.disabled_at is not None:
        return None
    return principal_for(session, user, token_id=row.id, kind="app_session")


def end_app_sessions(session: Session, user_id: int) -> None:
    """On signing out of the portal: the user's apps-host sessions end with it."""
    session.execute(
        update(TokenRow)
        .where(TokenRow.user_id == user_id, TokenRow.kind == "app_session", TokenRow.revoked_at.is_(None))
        .values(revoked_at=time.time())
    )


def safe_next(next_path: str) -> str:
    """A path on the apps host to go on to after signing in: under /apps/, and nowhere else."""
    if not next_path.startswith("/apps/") or any(c in next_path for c in "\\\r\n\t") or "//" in next_path:
        raise BadNext("next must be a path under /apps/")
    if any(part in (".", "..") for part in urlsplit(next_path).path.split("/")):
        raise BadNext("next must be a path under /apps/")
    return next_path
