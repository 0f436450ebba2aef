"""The gpupool command line. It talks to the server only through gpupool.client."""

from __future__ import annotations

import sys

import typer

from gpupool import __version__

app = typer.Typer(help="gpupool: a self-service internal GPU cloud.", no_args_is_help=True, add_completion=False)


@app.callback()
def _root() -> None:
    """Manage GPU workloads, projects and quotas."""


@app.command()
def version() -> None:
    """Print the gpupool version."""
    typer.echo(__version__)


@app.command()
def policies() -> None:
    """List the placement scoring policies the scheduler knows."""
    from gpupool.core import policy_names

    for name in policy_names():
        typer.echo(name)


def _register() -> None:
    from gpupool.cli import access, admin, policy, pools, server_cmd, simulate, workloads

    app.command()(server_cmd.server)
    app.command()(admin.login)
    app.command()(admin.whoami)
    app.add_typer(admin.department_app, name="department")
    app.add_typer(admin.project_app, name="project")
    app.add_typer(admin.user_app, name="user")
    app.add_typer(pools.pool_app, name="pool")
    app.add_typer(access.token_app, name="token")
    app.add_typer(access.member_app, name="member")
    app.add_typer(access.audit_app, name="audit")
    app.add_typer(access.secret_app, name="secret")
    admin.project_app.command("set")(access.project_set)
    app.command()(access.logout)
    admin.project_app.command("policy")(policy.policy)
    admin.department_app.command("policy")(policy.policy)
    app.add_typer(policy.report_app, name="report")
    app.command()(workloads.submit)
    app.command()(workloads.apply)
    app.command("list")(workloads.list_)
    app.command()(workloads.describe)
    app.command()(workloads.logs)
    app.command()(workloads.cancel)
    app.command()(workloads.resume)
    app.command("open")(workloads.open_)
    app.command()(workloads.nodes)
    app.add_typer(simulate.app, name="simulate")


_register()


def main() -> None:
    from gpupool.client import ApiError

    try:
        app()
    except ApiError as e:
        print(f"error: {e.reason}" if e.status in (0, 400, 401, 403, 404, 409, 422) else f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
