"""`gpupool rerun` and `gpupool delete`: a finished workload's name run again (its history kept), or deleted with
its files. `register(app)` adds them to the CLI."""

from __future__ import annotations

from typing import Annotated

import typer

from gpupool.cli.connection import Output, OutputOpt, client, emit_json
from gpupool.cli.submit import ProjectOpt


def rerun(name: str, project: ProjectOpt = None, output: Output = OutputOpt) -> None:
    """Run a finished workload again under its name, with the spec it was submitted with. The earlier run stays
    as its history (describe lists it)."""
    with client() as c:
        w = c.rerun(name, project)
    emit_json(w) if output is Output.json else print(f"workload {w.name}: {w.state} (id {w.id}; a new run)")


def delete(
    name: str,
    project: ProjectOpt = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask first.")] = False,
    output: Output = OutputOpt,
) -> None:
    """Delete a finished workload, the earlier runs of its name, and their files. A live one is refused: cancel
    it first."""
    if not yes and not typer.confirm(f"delete {name} and its files?"):
        raise typer.Exit(1)
    with client() as c:
        ids = c.delete(name, project)
    if output is Output.json:
        emit_json({"deleted": ids})
    else:
        print(f"deleted {name} ({len(ids)} run{'s' if len(ids) != 1 else ''}: ids {', '.join(map(str, ids))})")


def register(app: typer.Typer) -> None:
    app.command()(rerun)
    app.command()(delete)
