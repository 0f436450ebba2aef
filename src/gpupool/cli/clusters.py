"""`gpupool cluster`: the clusters of the fleet, the hub's own and the spokes admins add."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from gpupool.cli.connection import Output, OutputOpt, client, emit_json, fail, print_table
from gpupool.durations import format_duration as duration
from gpupool.models.clusters import ClusterCreate, ClusterPublic, PoolScope

cluster_app = typer.Typer(
    help="Clusters: the hub's own and the spokes it schedules (a Kubernetes cluster, or this host).",
    no_args_is_help=True,
)


def _status(c: ClusterPublic) -> str:
    word = c.status.value + (", draining" if c.draining else "")
    if c.down_since is not None:
        word += f" for {duration(time.time() - c.down_since)}"
    return word


def _table(rows: list[ClusterPublic]) -> None:
    print_table(
        "clusters",
        ("NAME", "KIND", "STATUS", "NODES", "GPUS", "ALLOCATED", "WORKLOADS"),
        (
            (c.name, c.kind.value, _status(c), str(c.nodes), str(c.gpus), f"{c.allocated_gpus:g}", str(c.workloads))
            for c in rows
        ),
    )


@cluster_app.command("add")
def cluster_add(
    name: str,
    kubeconfig: Annotated[
        Path | None, typer.Option("--kubeconfig", help="How the hub reaches it (kept in the store as a secret).")
    ] = None,
    local: Annotated[bool, typer.Option("--local", help="This host, run by the local backend.")] = False,
    pool_label: Annotated[
        str | None, typer.Option("--pool-label", help="The node label naming a node's pool (the hub's by default).")
    ] = None,
    pool_scope: Annotated[
        PoolScope,
        typer.Option(
            "--pool-scope",
            help="global: its pools are the fleet's, quotas and all; cluster: its own (named CLUSTER-POOL).",
        ),
    ] = PoolScope.GLOBAL,
    output: Output = OutputOpt,
) -> None:
    """Add a spoke (admins only): the hub reads its nodes from its next heartbeat and schedules work there."""
    text = None
    if kubeconfig is not None:
        try:
            text = kubeconfig.read_text()
        except OSError as e:
            fail(f"--kubeconfig {kubeconfig}: {e.strerror or e}")
    body = ClusterCreate(name=name, kubeconfig=text, local=local, pool_label=pool_label, pool_scope=pool_scope)
    with client() as c:
        added = c.add_cluster(body)
    if output is Output.json:
        emit_json(added)
    else:
        print(f"cluster {added.name} added ({added.kind.value}); the hub reaches it within a few seconds")


@cluster_app.command("list")
def cluster_list(output: Output = OutputOpt) -> None:
    """The clusters, whether each is up, and what it has and holds."""
    with client() as c:
        rows = c.list_clusters()
    emit_json(rows) if output is Output.json else _table(rows)


@cluster_app.command("describe")
def cluster_describe(name: str, output: Output = OutputOpt) -> None:
    """One cluster: its status, pools, nodes and the workloads that run there (admins only)."""
    with client() as c:
        d = c.describe_cluster(name)
    if output is Output.json:
        emit_json(d)
        return
    print(f"Cluster:    {d.name} ({d.kind.value})")
    print(f"Status:     {_status(d)}")
    if d.last_seen_at is not None:
        print(f"Last seen:  {duration(max(0.0, time.time() - d.last_seen_at))} ago")
    print(f"Pools:      {', '.join(d.pools) or '-'} ({d.pool_scope.value})")
    print(f"Nodes:      {d.nodes} schedulable, {d.gpus} GPUs, {d.allocated_gpus:g} allocated")
    for node in d.node_names:
        print(f"  {node}")
    print(f"Workloads:  {len(d.running)}")
    for w in d.running:
        print(f"  {w}")


@cluster_app.command("drain")
def cluster_drain(
    name: str,
    undo: Annotated[bool, typer.Option("--undo", help="Let it take new work again.")] = False,
    output: Output = OutputOpt,
) -> None:
    """Take no new work there (admins only); what runs there runs on until it ends."""
    with client() as c:
        out = c.drain_cluster(name, not undo)
    if output is Output.json:
        emit_json(out)
    else:
        print(f"cluster {out.name}: {'draining: no new work' if out.draining else 'takes new work'}")


@cluster_app.command("remove")
def cluster_remove(name: str) -> None:
    """Forget a spoke and its nodes (admins only); refused while workloads run there."""
    with client() as c:
        c.remove_cluster(name)
    print(f"cluster {name} removed")
