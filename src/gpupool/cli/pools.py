"""Pools: the node groups GPUs are in, and what admins set for each."""

from __future__ import annotations

from typing import Annotated

import typer

from gpupool.cli.connection import Output, OutputOpt, client, emit_json, fail, print_table
from gpupool.models.system import PoolPublic, PoolUpdate

pool_app = typer.Typer(
    help="Pools: node groups, and whether their devices are shared across projects.", no_args_is_help=True
)


def _pools_table(rows: list[PoolPublic]) -> None:
    print_table(
        "pools",
        ("NAME", "NODES", "GPUS", "SHARE ACROSS PROJECTS"),
        ((p.name, str(p.nodes), str(p.gpus), "yes" if p.share_across_projects else "no") for p in rows),
    )


@pool_app.command("list")
def pool_list(output: Output = OutputOpt) -> None:
    """List the pools, their nodes and GPUs, and whether fractions of different projects may share a device."""
    with client() as c:
        rows = c.list_pools()
    emit_json(rows) if output is Output.json else _pools_table(rows)


@pool_app.command("set")
def pool_set(
    name: str,
    share: Annotated[
        bool | None,
        typer.Option(
            "--share-across-projects/--no-share-across-projects",
            help="Whether fractions of different projects may share one device. Their GPU memory and compute "
            "are not isolated from each other.",
            show_default=False,
        ),
    ] = None,
    output: Output = OutputOpt,
) -> None:
    """Change a pool's settings (admins only); the scheduler follows them from its next cycle."""
    if share is None:
        fail("nothing to set: say --share-across-projects or --no-share-across-projects")
    with client() as c:
        p = c.update_pool(name, PoolUpdate(share_across_projects=share))
    if output is Output.json:
        emit_json(p)
    else:
        may = "may" if p.share_across_projects else "may not"
        print(f"pool {p.name}: fractions of different projects {may} share a device")
