"""Connecting, and managing departments, projects, quotas and users."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from gpupool.cli import contexts
from gpupool.cli.connection import Output, OutputOpt, client, emit_json, fail, print_table
from gpupool.client import ApiError, Client
from gpupool.models.accounts import LoginResponse, Offboarded, UserCreate
from gpupool.models.schemas import DepartmentCreate, ProjectCreate, QueuePublic, QuotaUpdate

department_app = typer.Typer(help="Departments: groups of projects with a quota of their own.", no_args_is_help=True)
project_app = typer.Typer(help="Projects: where workloads live, each with a quota.", no_args_is_help=True)
user_app = typer.Typer(help="Users and their tokens (admins only).", no_args_is_help=True)

Deserved = Annotated[float, typer.Option("--deserved-gpus", help="GPUs guaranteed (fractions allowed).", min=0)]
Limit = Annotated[float | None, typer.Option("--limit-gpus", help="Hard cap on GPUs (default: none).", min=0)]
Weight = Annotated[int, typer.Option("--weight", help="Share of idle GPUs it may borrow, relative to others.", min=0)]
Pool = Annotated[str, typer.Option("--pool", help="The pool (node group) these GPUs are in.")]


def login(
    url: Annotated[str, typer.Option("--url", help="The server, e.g. http://127.0.0.1:8470")],
    token: Annotated[
        str | None, typer.Option("--token", help="Your token (`gpupool token create`, or the admin's first).")
    ] = None,
    sso: Annotated[
        bool, typer.Option("--sso", help="Sign in through the server's identity provider, in a browser.")
    ] = False,
    context: Annotated[
        str | None, typer.Option("--context", help="Save it as this context (default: the current one).")
    ] = None,
) -> None:
    """Save the server and token for later commands (mode 600): a token you have, or (--sso) a session from
    single sign-on, approved in a browser. The context it is saved in becomes the current one."""
    if (token is None) == (not sso):
        fail("give --token TOKEN or --sso, one of them", 2)
    if token is None:
        token = _device_login(url)
    with Client(url, token) as c:
        me = c.whoami()
    cfg = contexts.load()
    name = context or cfg.selected()
    cfg.editable(name).update({"url": url, "token": token})
    cfg.current = name
    path = contexts.save(cfg)
    where = "" if name == contexts.DEFAULT_CONTEXT else f" (context {name})"
    print(f"logged in to {url} as {me.name} ({me.role}); saved in {path}{where}")


def _device_login(url: str) -> str:
    """The provider's device flow through the server: show the code, poll at the interval, return the session."""
    try:
        with Client(url, None) as c:
            start = c.sso_device_begin()
            print(f"open {start.verification_uri_complete or start.verification_uri} (code {start.user_code})",
                  flush=True)  # fmt: skip
            interval = float(start.interval)
            deadline = time.monotonic() + start.expires_in
            while time.monotonic() < deadline:
                time.sleep(interval)
                got = c.sso_device_poll(start.handle)
                if isinstance(got, LoginResponse):
                    return got.token
                interval = float(got.interval)
    except KeyboardInterrupt:
        fail("interrupted: not logged in", 130)
    except ApiError as e:
        if e.status in (404, 410):
            fail(f"not logged in: {e.reason}", 1)
        fail(f"single sign-on refused: {e.reason}" if e.status == 403 else e.reason, 1)
    fail("the code expired before it was approved: not logged in; run `gpupool login --sso` again", 1)


def whoami(output: Output = OutputOpt) -> None:
    """Who the saved token belongs to."""
    with client() as c:
        me = c.whoami()
    if output is Output.json:
        emit_json(me)
    else:
        print(f"{me.name} ({me.role}); projects: {', '.join(me.projects) or 'none'}")


def _queues_table(rows: list[QueuePublic], title: str) -> None:
    print_table(
        title,
        ("NAME", "DEPARTMENT", "POOL", "DESERVED", "LIMIT", "WEIGHT", "ALLOCATED"),
        (
            (q.name, q.parent or "-", quota.pool, f"{quota.deserved_gpus:g}",
             "-" if quota.limit_gpus is None else f"{quota.limit_gpus:g}", str(quota.weight), f"{q.allocated_gpus:g}")
            for q in rows
            for quota in q.quotas or []
        ),
    )  # fmt: skip


@department_app.command("create")
def department_create(
    name: str,
    deserved: Deserved = 0,
    limit: Limit = None,
    weight: Weight = 1,
    pool: Pool = "default",
    output: Output = OutputOpt,
) -> None:
    """Create a department."""
    with client() as c:
        q = c.create_department(
            DepartmentCreate(name=name, deserved_gpus=deserved, limit_gpus=limit, weight=weight, pool=pool)
        )
    emit_json(q) if output is Output.json else print(f"department {q.name} created")


@department_app.command("list")
def department_list(output: Output = OutputOpt) -> None:
    """List departments and their quotas."""
    with client() as c:
        rows = c.list_departments()
    emit_json(rows) if output is Output.json else _queues_table(rows, "departments")


@project_app.command("create")
def project_create(
    name: str,
    department: Annotated[str | None, typer.Option("--department", help="The department it belongs to.")] = None,
    deserved: Deserved = 0,
    limit: Limit = None,
    weight: Weight = 1,
    pool: Pool = "default",
    output: Output = OutputOpt,
) -> None:
    """Create a project."""
    body = ProjectCreate(
        name=name, department=department, deserved_gpus=deserved, limit_gpus=limit, weight=weight, pool=pool
    )
    with client() as c:
        q = c.create_project(body)
    emit_json(q) if output is Output.json else print(f"project {q.name} created")


@project_app.command("list")
def project_list(output: Output = OutputOpt) -> None:
    """List the projects you can see, their quotas and what they hold now."""
    with client() as c:
        rows = c.list_projects()
    emit_json(rows) if output is Output.json else _queues_table(rows, "projects")


@project_app.command("quota")
def project_quota(
    name: str,
    deserved: Annotated[float | None, typer.Option("--deserved-gpus", min=0)] = None,
    limit: Limit = None,
    no_limit: Annotated[bool, typer.Option("--no-limit", help="Remove the hard cap.")] = False,
    weight: Annotated[int | None, typer.Option("--weight", min=0)] = None,
    pool: Pool = "default",
    output: Output = OutputOpt,
) -> None:
    """Change a project's (or department's) quota in one pool."""
    body = QuotaUpdate(pool=pool, deserved_gpus=deserved, limit_gpus=limit, clear_limit=no_limit, weight=weight)
    with client() as c:
        q = c.update_quota(name, body)
    emit_json(q) if output is Output.json else print(f"quota of {q.name} updated")


@user_app.command("create")
def user_create(
    name: str,
    role: Annotated[str, typer.Option("--role", help="admin, member or viewer.")] = "member",
    projects: Annotated[
        list[str] | None, typer.Option("--project", help="A project it belongs to (repeatable).")
    ] = None,
    output: Output = OutputOpt,
) -> None:
    """Create a user and print its token (shown once)."""
    if role not in ("admin", "member", "viewer"):
        fail(f"--role {role!r}: expected admin, member or viewer", 2)
    with client() as c:
        u = c.create_user(UserCreate(name=name, role=role, projects=projects or []))
    if output is Output.json:
        emit_json(u)
    else:
        print(f"user {u.name} ({u.role}) created; projects: {', '.join(u.projects) or 'none'}")
        print(f"token (shown once): {u.token}")


@user_app.command("password")
def user_password(
    name: str,
    password: Annotated[
        str,
        typer.Option(
            "--password", prompt=True, hide_input=True, confirmation_prompt=True, help="At least 8 characters."
        ),
    ],
    current: Annotated[str | None, typer.Option("--current", help="Your current password, to change your own.")] = None,
) -> None:
    """Set a user's password for the portal: your own (with --current, where you have one; your other sessions
    end), or anyone's as an admin."""
    with client() as c:
        c.set_password(name, password, current)
    print(f"password of {name} set")


@user_app.command("list")
def user_list(
    deleted: Annotated[bool, typer.Option("--deleted", help="Deleted users too.")] = False, output: Output = OutputOpt
) -> None:
    """List users, their roles, projects and state (active, disabled, deleted)."""
    with client() as c:
        rows = c.list_users(deleted)
    if output is Output.json:
        emit_json(rows)
        return
    print_table("users", ("NAME", "ROLE", "STATE", "PROJECTS"),
                ((u.name, u.role, u.state, ", ".join(u.projects) or "-") for u in rows))  # fmt: skip


KeepWork = Annotated[
    bool, typer.Option("--keep-work", help="Leave their running and queued workloads as they are (default: cancel).")
]


def said(what: str, out: Offboarded) -> str:
    """What an offboarding did: the user and the work it cancelled, then any service token they made, which is
    their project's and still works."""
    if not out.stopped:
        line = f"{what}; none of their workloads was stopped"
    else:
        line = f"{what}; cancelled {len(out.stopped)} of their workload(s): {', '.join(out.stopped)}"
    for t in out.service_tokens:
        line += (f"\nnote: service token {t.id} ({t.name}, project {t.project}), which they made, still works: it is "
                 f"the project's; if they may know it, gpupool token revoke {t.id}")  # fmt: skip
    return line


@user_app.command("disable")
def user_disable(name: str, keep_work: KeepWork = False, output: Output = OutputOpt) -> None:
    """Offboard someone for now: none of their tokens, sessions or apps works until `user enable`; their live
    workloads are cancelled (unless --keep-work)."""
    with client() as c:
        out = c.disable_user(name, keep_work)
    emit_json(out) if output is Output.json else print(said(f"user {name} disabled", out))


@user_app.command("enable")
def user_enable(name: str) -> None:
    """Let a disabled user sign in again, with the tokens it had."""
    with client() as c:
        c.enable_user(name)
    print(f"user {name} enabled")


@user_app.command("delete")
def user_delete(name: str, keep_work: KeepWork = False, output: Output = OutputOpt) -> None:
    """Offboard someone for good: their tokens revoked, out of every project and of `user list`; their name stays
    with their workloads and reports (and is not given to anyone else). Their live workloads are cancelled
    (unless --keep-work)."""
    with client() as c:
        out = c.delete_user(name, keep_work)
    emit_json(out) if output is Output.json else print(said(f"user {name} deleted", out))


__all__ = ["ApiError", "department_app", "login", "project_app", "user_app", "whoami"]
