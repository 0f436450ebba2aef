"""Shells into running workloads: exec, attach and port-forward (docs/shells.md)."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from gpupool.cli import contexts
from gpupool.cli.connection import client, fail
from gpupool.cli.submit import ProjectOpt

RankOpt = Annotated[int, typer.Option("--rank", min=0, help="The member (0 is the first; a gang's ranks go up).")]


# gpupool.client.shell (and websockets) load when a shell is opened, not for every command: `--help` stays quick.
if TYPE_CHECKING:
    from gpupool.client.shell import Shell


def _shell() -> Shell:
    from gpupool.client.shell import Shell

    with client() as c:  # the CLI's own checks and messages: logged in, a known context
        url = c.url
    token, _ = contexts.setting(contexts.load(), "token")
    return Shell(url, token or "")


def _terminal(tty: bool) -> dict[str, str]:
    """The terminal's size, sent with the request so that the command starts with it."""
    if not tty:
        return {}
    size = os.get_terminal_size(sys.stdin.fileno())
    return {"cols": str(size.columns), "rows": str(size.lines)}


def exec_(
    name: str,
    command: Annotated[list[str], typer.Argument(help="The command and its arguments, after `--`.")],
    rank: RankOpt = 0,
    project: ProjectOpt = None,
    tty: Annotated[
        bool | None, typer.Option("--tty/--no-tty", "-t/-T", help="A terminal (default: when stdin is one).")
    ] = None,
) -> None:
    """Run a command inside a running workload's member, as the workload runs (its user, files, environment
    and network); its exit status is this command's."""
    want_tty = sys.stdin.isatty() if tty is None else tty
    if want_tty and not sys.stdin.isatty():
        fail("--tty needs a terminal as stdin", 2)
    shell = _shell()

    from gpupool.client.shell import interact, params

    async def run() -> int:
        ws = await shell.open(
            name, "exec", params(project, rank, command=command, tty=str(want_tty).lower(), **_terminal(want_tty))
        )
        async with ws:
            return await interact(ws, want_tty)

    try:
        code = asyncio.run(run())
    except KeyboardInterrupt:
        code = 130
    raise typer.Exit(code)


def attach(name: str, rank: RankOpt = 0, project: ProjectOpt = None) -> None:
    """Follow a running workload's output and send it this terminal's input (its stdin); Ctrl-C detaches and
    leaves it running."""
    shell = _shell()

    from gpupool.client.shell import interact, params

    async def run() -> int:
        ws = await shell.open(name, "attach", params(project, rank))
        async with ws:
            # The end of this input is not the workload's: it keeps its stdin for the next client.
            return await interact(ws, False, send_eof=False)

    try:
        raise typer.Exit(asyncio.run(run()))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def port_forward(
    name: str,
    ports: Annotated[
        str, typer.Argument(metavar="LOCAL:REMOTE", help="A local port (0: any free one) and one of the workload's.")
    ],
    rank: RankOpt = 0,
    project: ProjectOpt = None,
) -> None:
    """Forward 127.0.0.1:LOCAL to REMOTE inside a running workload (what the workload itself reaches at
    127.0.0.1:REMOTE), until Ctrl-C."""
    local_s, sep, remote_s = ports.partition(":")
    if not sep:
        local_s = remote_s = ports
    try:
        local, remote = int(local_s), int(remote_s)
    except ValueError:
        fail(f"ports must be LOCAL:REMOTE or PORT, as numbers: not {ports!r}", 2)
    if not (0 <= local < 65536 and 0 < remote < 65536):
        fail(f"ports must be TCP ports (LOCAL 0-65535, REMOTE 1-65535): not {ports!r}", 2)
    shell = _shell()
    with client() as c:  # fail at once for a workload that is not there
        c.describe(name, project)

    from gpupool.client.shell import forward, params

    def ready(port: int) -> None:
        print(f"Forwarding from 127.0.0.1:{port} -> {remote}", flush=True)

    try:
        asyncio.run(forward(shell, name, params(project, rank, port=str(remote)), local, ready))
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
    except OSError as e:
        fail(f"cannot listen on 127.0.0.1:{local}: {e.strerror}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    app.command("exec")(exec_)
    app.command("attach")(attach)
    app.command("port-forward")(port_forward)
