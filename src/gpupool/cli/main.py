"""The gpupool command line. The control plane arrives with the server issue; for now: help and version."""

from __future__ import annotations

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
    from gpupool.cli import simulate

    app.add_typer(simulate.app, name="simulate")


_register()


def main() -> None:
    app()
