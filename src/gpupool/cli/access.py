"""Tokens, memberships, project settings, the audit trail and signing out."""

from __future__ import annotations

import sys
import time
from typing import Annotated

import typer
from pydantic import ValidationError

from gpupool.cli import contexts
from gpupool.cli.admin import said
from gpupool.cli.connection import Output, OutputOpt, client, emit_json, fail, print_table
from gpupool.cli.policy import _when
from gpupool.models.access import ProjectSettings, TokenCreate

token_app = typer.Typer(help="Your tokens, your projects' service tokens and API keys.", no_args_is_help=True)
member_app = typer.Typer(help="Who is in a project (member, viewer) or runs a department (admin).",
                         no_args_is_help=True)  # fmt: skip
secret_app = typer.Typer(help="A project's secrets: environment variables of its workloads, never shown back.",
                         no_args_is_help=True)  # fmt: skip
audit_app = typer.Typer(help="The audit trail (admins; department admins see their department).", no_args_is_help=True)


def _day(at: float | None) -> str:
    return "-" if at is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(at))


@token_app.command("create")
def token_create(
    name: str,
    project: Annotated[str | None, typer.Option("-p", "--project", help="Narrow it to one project.")] = None,
    role: Annotated[str | None, typer.Option("--role", help="member or viewer: the most it may do.")] = None,
    service: Annotated[bool, typer.Option("--service", help="A service token of the project (for CI).")] = False,
    app: Annotated[str | None, typer.Option("--app", help="An API key that opens this inference service.")] = None,
    metrics: Annotated[bool, typer.Option("--metrics", help="Prometheus's scrape token (admins).")] = False,
    days: Annotated[int, typer.Option("--expires-days", help="Days until it expires (1-365).")] = 90,
    output: Output = OutputOpt,
) -> None:
    """Make a token and print it (shown once)."""
    kind = "apikey" if app else "service" if service else "metrics" if metrics else "personal"
    if role not in (None, "member", "viewer"):
        fail(f"--role {role!r}: expected member or viewer", 2)
    if not 1 <= days <= 365:
        fail(f"--expires-days {days}: expected 1 to 365", 2)
    body = TokenCreate.model_validate(
        {"name": name, "kind": kind, "project": project, "role": role, "app": app, "expires_in_days": days}
    )
    with client() as c:
        t = c.create_token(body)
    if output is Output.json:
        emit_json(t)
        return
    scope = f" for {t.project}" + (f"/{t.app}" if t.app else "") if t.project else ""
    print(f"{t.kind} token {t.name} (id {t.id}){scope}, role {t.role or 'yours'}, expires {_day(t.expires_at)}")
    print(f"token (shown once): {t.token}")


@token_app.command("list")
def token_list(
    revoked: Annotated[bool, typer.Option("--revoked", help="Also those revoked or expired.")] = False,
    output: Output = OutputOpt,
) -> None:
    """Your tokens and sessions, and the service tokens and API keys of projects you work in."""
    with client() as c:
        rows = c.list_tokens(revoked)
    if output is Output.json:
        emit_json(rows)
        return
    print_table(
        "tokens",
        ("ID", "NAME", "KIND", "USER", "PROJECT", "ROLE", "EXPIRES", "LAST USED", "REVOKED"),
        ((str(t.id), t.name, t.kind, t.user, (t.project or "-") + (f"/{t.app}" if t.app else ""), t.role or "-",
          _day(t.expires_at), _day(t.last_used_at), _day(t.revoked_at)) for t in rows),
    )  # fmt: skip


@token_app.command("revoke")
def token_revoke(token_id: int) -> None:
    """Revoke a token at once."""
    with client() as c:
        t = c.revoke_token(token_id)
    print(f"token {t.name} (id {t.id}) revoked")


@member_app.command("set")
def member_set(
    queue: str,
    user: str,
    role: Annotated[str, typer.Option("--role", help="member or viewer (projects), admin (departments).")] = "member",
) -> None:
    """Add someone to a project or department, or change their role there."""
    if role not in ("member", "viewer", "admin"):
        fail(f"--role {role!r}: expected member, viewer or admin", 2)
    with client() as c:
        m = c.set_member(queue, user, role)
    print(f"{m.user} is {m.role} of {m.queue}")


@member_app.command("remove")
def member_remove(
    queue: str,
    user: str,
    keep_work: Annotated[
        bool, typer.Option("--keep-work", help="Leave their workloads in the project running (default: cancel).")
    ] = False,
) -> None:
    """Take someone out of a project or department: their live workloads in the project are cancelled (unless
    --keep-work) and their open app sessions end within a minute."""
    with client() as c:
        out = c.remove_member(queue, user, keep_work)
    print(said(f"{user} removed from {queue}", out))


@member_app.command("list")
def member_list(queue: str, output: Output = OutputOpt) -> None:
    with client() as c:
        rows = c.list_members(queue)
    if output is Output.json:
        emit_json(rows)
        return
    print_table(queue, ("USER", "ROLE"), ((m.user, m.role) for m in rows))


Project = Annotated[str, typer.Option("-p", "--project", help="The project.")]


@secret_app.command("set")
def secret_set(
    name: str,
    project: Project,
    value: Annotated[
        str | None, typer.Option("--value", help="The value (default: read from standard input, not echoed).")
    ] = None,
) -> None:
    """Set a secret; workloads of the project started from now on get it as $NAME."""
    if value is None:
        value = sys.stdin.readline().rstrip("\n") if not sys.stdin.isatty() else typer.prompt("value", hide_input=True)
    with client() as c:
        sec = c.set_secret(project, name, value)
    print(f"secret {sec.name} of {sec.project} set")


@secret_app.command("list")
def secret_list(project: Project, output: Output = OutputOpt) -> None:
    """Names of the project's secrets, and who set them when (never their values)."""
    with client() as c:
        rows = c.list_secrets(project)
    if output is Output.json:
        emit_json(rows)
        return
    print_table(f"secrets of {project}", ("NAME", "SET BY", "SET AT"),
                ((r.name, r.updated_by, _day(r.updated_at)) for r in rows))  # fmt: skip


@secret_app.command("delete")
def secret_delete(name: str, project: Project) -> None:
    with client() as c:
        c.delete_secret(project, name)
    print(f"secret {name} of {project} deleted")


def project_set(
    name: str,
    production: Annotated[
        bool | None, typer.Option("--production-allowed/--no-production-allowed", help="Members may use production.")
    ] = None,
    pod_security: Annotated[
        str | None, typer.Option("--pod-security", help="restricted or baseline (Kubernetes; admins only).")
    ] = None,
    mlflow_uri: Annotated[
        str | None, typer.Option("--mlflow-uri", help='Its MLflow tracking server ("" removes it).')
    ] = None,
    host_network: Annotated[
        bool | None,
        typer.Option(
            "--host-network/--no-host-network",
            help="Its local workloads share the host's network, loopback included (admins only; default: one each).",
        ),
    ] = None,
) -> None:
    """Change a project's settings."""
    if pod_security not in (None, "restricted", "baseline"):
        fail(f"--pod-security {pod_security!r}: expected restricted or baseline", 2)
    try:
        body = ProjectSettings.model_validate(
            {
                "production_allowed": production, "pod_security": pod_security, "mlflow_uri": mlflow_uri,
                "host_network": host_network,
            }
        )
    except ValidationError:
        fail(f'--mlflow-uri {mlflow_uri!r}: expected an http(s):// address, or "" to remove it', 2)
    with client() as c:
        q = c.update_project(name, body)
    print(f"project {q.name}: production {'allowed' if q.production_allowed else 'not allowed'} for members, "
          f"pods {q.pod_security}" + (", the host's network" if q.host_network else "")
          + (f", MLflow {q.mlflow_uri}" if q.mlflow_uri else ""))  # fmt: skip


@audit_app.command("list")
def audit_list(
    since: Annotated[str | None, typer.Option("--since", help="ISO date or time (UTC).")] = None,
    actor: Annotated[str | None, typer.Option("--actor", help="Only this caller.")] = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many, newest first (1-1000).")] = 200,
    output: Output = OutputOpt,
) -> None:
    """Mutating requests and sign-ins, newest first."""
    if not 1 <= limit <= 1000:
        fail(f"--limit {limit}: expected 1 to 1000", 2)
    with client() as c:
        rows = c.audit(_when(since) if since else None, actor, limit)
    if output is Output.json:
        emit_json(rows)
        return
    print_table(
        "audit",
        ("WHEN", "ACTOR", "ROLE", "TENANT", "ACTION", "OBJECT", "RESULT"),
        ((time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a.at)), a.actor or "-", a.role or "-", a.tenant or "-",
          a.action, a.object, str(a.status)) for a in rows),
    )  # fmt: skip


def logout() -> None:
    """Forget the saved token; a session token is revoked on the server too."""
    cfg = contexts.load()
    token = cfg.context().get("token")
    if token is not None and token.startswith("gps_"):
        with client() as c:
            c.logout()
    cfg.editable().pop("token", None)
    path = contexts.save(cfg)
    print(f"logged out; {path} keeps no token for context {cfg.selected()}")
