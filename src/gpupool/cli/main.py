"""The gpupool command line. It talks to the server only through gpupool.client.

`pip install gpupool` is this CLI and the Python SDK. The commands that run the server or the simulator need an
extra (gpupool[server], gpupool[sim]): they are listed at once but imported only when run, and without their extra
they say which one to install instead of failing on an import."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import import_module, metadata
from typing import Annotated, Any, NoReturn

import typer

from gpupool import __version__


def _refuse(what: str, extra: str, why: str) -> NoReturn:
    print(f"error: {what} needs gpupool's {extra} extra ({why}): pip install 'gpupool[{extra}]'", file=sys.stderr)
    raise SystemExit(1)


def _missing_requirements(extra: str) -> list[str]:
    """The requirements of `extra` that are not installed, read from gpupool's own metadata (so pyproject.toml is
    the one list). None are known missing when gpupool runs from a source tree without metadata: the import then
    tells."""
    try:
        requires = metadata.requires("gpupool") or []
    except metadata.PackageNotFoundError:
        return []
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    missing = []
    for line in requires:
        req = Requirement(line)
        # An extra that brings another (postgres brings server) names gpupool itself: that one is checked on its own.
        if req.marker is None or not req.marker.evaluate({"extra": extra}) or canonicalize_name(req.name) == "gpupool":
            continue
        try:
            installed = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            missing.append(req.name)
            continue
        if not req.specifier.contains(installed, prereleases=True):
            missing.append(f"{req.name}{req.specifier} (have {installed})")
    return missing


@contextmanager
def _needs(extra: str, what: str) -> Iterator[None]:
    """Imports in the block that fail for want of a third-party module name the extra that brings it."""
    try:
        yield
    except ModuleNotFoundError as e:
        if (e.name or "").partition(".")[0] == "gpupool":
            raise
        _refuse(what, extra, f"no module named {e.name!r}")


def _run_extra(
    ctx: typer.Context, extra: str, load: Callable[[], typer.Typer], help_only: Callable[[], typer.Typer] | None = None
) -> None:
    """Run the command of an extra with this command's arguments, once the extra is known to be installed.
    `help_only` loads the command without the extra, for its --help: what it does is worth reading before
    installing it."""
    what = ctx.command_path
    missing = _missing_requirements(extra)
    if missing and help_only is not None and "--help" in ctx.args:
        print(f"note: {what} needs gpupool's {extra} extra, not installed here: pip install 'gpupool[{extra}]'",
              file=sys.stderr)  # fmt: skip
        help_only()(args=ctx.args, prog_name=what, standalone_mode=False)
        return
    if missing:
        _refuse(what, extra, "missing " + ", ".join(missing))
    with _needs(extra, what):
        command = load()
    # Not standalone: a bad flag reaches main()'s handler, to be said in one line as every other command's is.
    code = command(args=ctx.args, prog_name=what, standalone_mode=False)
    if isinstance(code, int) and code:
        raise SystemExit(code)


def _server_app() -> typer.Typer:
    from gpupool.cli import server_cmd

    single = typer.Typer(add_completion=False)
    single.command()(server_cmd.server)
    return single


def _simulate_help() -> typer.Typer:
    from gpupool.cli import simulate  # its commands import the simulator only when they run

    return simulate.app


def _simulate_app() -> typer.Typer:
    # The simulator's own modules, so that a missing numpy shows here rather than halfway through a command.
    from gpupool.sim import org, packing_report  # noqa: F401

    return _simulate_help()


app = typer.Typer(help="gpupool: a self-service internal GPU cloud.", no_args_is_help=True)
# An extra's command takes every argument as it comes (--help too) and hands them to the real command once loaded.
_PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"gpupool {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    context: Annotated[
        str | None,
        typer.Option("--context", envvar="GPUPOOL_CONTEXT", help="The saved context (server) to use this once."),
    ] = None,
    _version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Manage GPU workloads, projects and quotas. `gpupool --install-completion` turns on tab completion."""
    from gpupool.cli import contexts

    contexts.chosen = context


@app.command()
def version() -> None:
    """Print the gpupool version."""
    typer.echo(__version__)


@app.command(context_settings=_PASS_THROUGH, add_help_option=False)
def server(ctx: typer.Context) -> None:
    """Start the gpupool server: API, scheduler, store and this host's GPUs. Needs the server extra."""
    _run_extra(ctx, "server", _server_app)


@app.command("simulate", context_settings=_PASS_THROUGH, add_help_option=False)
def simulate_(ctx: typer.Context) -> None:
    """Replay public GPU-cluster traces through gpupool's scheduler. Needs the sim extra."""
    _run_extra(ctx, "sim", _simulate_app, _simulate_help)


@app.command()
def policies() -> None:
    """List the placement scoring policies the scheduler knows. Needs the server extra."""
    with _needs("server", "gpupool policies"):
        from gpupool.core import policy_names

    for name in policy_names():
        typer.echo(name)


def _register() -> None:
    from gpupool.cli import (
        access,
        admin,
        attempts,
        clusters,
        config_cmd,
        policy,
        pools,
        shell,
        submit,
        sweeps,
        volumes,
        workloads,
    )

    app.command()(admin.login)
    app.command()(admin.whoami)
    app.add_typer(admin.department_app, name="department")
    app.add_typer(admin.project_app, name="project")
    app.add_typer(admin.user_app, name="user")
    app.add_typer(pools.pool_app, name="pool")
    app.add_typer(clusters.cluster_app, name="cluster")
    app.add_typer(sweeps.sweep_app, name="sweep")
    admin.department_app.command("burst")(clusters.department_burst)
    app.add_typer(access.token_app, name="token")
    app.add_typer(access.member_app, name="member")
    app.add_typer(access.audit_app, name="audit")
    app.add_typer(access.secret_app, name="secret")
    admin.project_app.command("set")(access.project_set)
    app.command()(access.logout)
    admin.project_app.command("policy")(policy.policy)
    admin.department_app.command("policy")(policy.policy)
    app.add_typer(policy.report_app, name="report")
    app.add_typer(config_cmd.config_app, name="config")
    app.command()(submit.submit)
    app.command()(submit.apply)
    attempts.register(app)
    app.command("list")(workloads.list_)
    app.command()(workloads.describe)
    app.command()(workloads.logs)
    app.command()(workloads.cancel)
    app.command()(workloads.resume)
    app.command("open")(workloads.open_)
    app.command()(workloads.nodes)
    volumes.register(app)
    shell.register(app)


_register()


# Typer vendors Click from 0.2x on (its errors derive from typer.TyperException); older ones raise Click's own.
_UsageErrors: type[Exception] = getattr(typer, "TyperException", None) or import_module("click").ClickException


def _usage_error(e: Any) -> NoReturn:
    """A bad flag or value in one line on stderr, exit 2, as the CLI's own checks say theirs."""
    ctx = getattr(e, "ctx", None)
    if type(e).__name__ == "NoArgsIsHelpError" and ctx is not None:
        typer.echo(ctx.get_help())  # a bare group (`gpupool`, `gpupool config`) shows its help
        raise SystemExit(e.exit_code)
    message = " ".join(e.format_message().replace("Value error, ", "").split())
    hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
    print(f"error: {message}{hint}", file=sys.stderr)
    raise SystemExit(e.exit_code)


def main() -> None:
    from gpupool.client import ApiError

    try:
        code = app(standalone_mode=False)
    except _UsageErrors as e:
        _usage_error(e)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        raise SystemExit(1) from None
    except ApiError as e:
        print(f"error: {e.reason}" if e.status in (0, 400, 401, 403, 404, 409, 422) else f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    raise SystemExit(code if isinstance(code, int) else 0)
