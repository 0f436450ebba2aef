"""`gpupool cluster`: the clusters of the fleet, the hub's own and the spokes admins add."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from gpupool.cli.connection import Output, OutputOpt, client, emit_json, fail, print_table
from gpupool.durations import duration_flag
from gpupool.durations import format_duration as duration
from gpupool.models.clusters import BurstSettings, ClusterCreate, ClusterPublic, DepartmentBurstSet, PoolScope

cluster_app = typer.Typer(
    help="Clusters: the hub's own and the spokes it schedules (a Kubernetes cluster, or this host).",
    no_args_is_help=True,
)


def _gpus(n: int) -> str:
    return f"{n} GPU{'' if n == 1 else 's'}"


def _status(c: ClusterPublic) -> str:
    word = c.status.value + (", draining" if c.draining else "")
    if c.down_since is not None:
        word += f" for {duration(time.time() - c.down_since)}"
    return word


def _kind(c: ClusterPublic) -> str:
    return c.kind.value if c.burst is None else f"{c.kind.value}, burst ${c.burst.price_per_gpu_hour:g}/GPU-h"


def _table(rows: list[ClusterPublic]) -> None:
    print_table(
        "clusters",
        ("NAME", "KIND", "STATUS", "NODES", "GPUS", "ALLOCATED", "WORKLOADS"),
        (
            (c.name, _kind(c), _status(c), str(c.nodes), str(c.gpus), f"{c.allocated_gpus:g}", str(c.workloads))
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
    burst_price: Annotated[
        float | None,
        typer.Option("--burst-price", help="Burst capacity: dollars per GPU-hour (with --burst-max-gpus)."),
    ] = None,
    burst_max_gpus: Annotated[
        int | None, typer.Option("--burst-max-gpus", help="Burst capacity: the most GPUs it may hold.")
    ] = None,
    burst_delay: Annotated[
        float, typer.Option("--burst-delay", parser=duration_flag, help="From the ask to nodes ready (5m).")
    ] = 300.0,
    burst_idle: Annotated[
        float, typer.Option("--burst-idle", parser=duration_flag, help="Idle this long, a node is given back (10m).")
    ] = 600.0,
    burst_node_gpus: Annotated[int, typer.Option("--burst-node-gpus", help="GPUs of one node it adds.")] = 8,
    burst_gpu_model: Annotated[
        str | None, typer.Option("--burst-gpu-model", help="Its nodes' GPU model, for work that names models.")
    ] = None,
    output: Output = OutputOpt,
) -> None:
    """Add a spoke (admins only): the hub reads its nodes from its next heartbeat and schedules work there. With
    --burst-price and --burst-max-gpus its capacity is rented on demand (docs/clusters.md)."""
    text = None
    if kubeconfig is not None:
        try:
            text = kubeconfig.read_text()
        except OSError as e:
            fail(f"--kubeconfig {kubeconfig}: {e.strerror or e}")
    burst = None
    if (burst_price is None) != (burst_max_gpus is None):
        fail("a burst cluster needs both --burst-price and --burst-max-gpus", 2)
    if burst_price is not None and burst_max_gpus is not None:
        try:
            burst = BurstSettings(
                price_per_gpu_hour=burst_price, max_gpus=burst_max_gpus, delay_s=burst_delay,
                idle_release_s=burst_idle, node_gpus=burst_node_gpus, gpu_model=burst_gpu_model,
            )  # fmt: skip
        except ValidationError as e:
            fail("; ".join(f"--burst-{'-'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors()), 2)
    body = ClusterCreate(
        name=name, kubeconfig=text, local=local, pool_label=pool_label, pool_scope=pool_scope, burst=burst
    )
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
    print(f"Cluster:    {d.name} ({_kind(d)})")
    if d.burst is not None:
        b = d.burst
        model = f" {b.gpu_model}" if b.gpu_model else ""
        print(f"Burst:      up to {_gpus(b.max_gpus)} in nodes of {b.node_gpus}{model}, ready {duration(b.delay_s)} "
              f"after the ask, given back after {duration(b.idle_release_s)} idle")  # fmt: skip
    print(f"Status:     {_status(d)}")
    if d.last_seen_at is not None:
        print(f"Last seen:  {duration(max(0.0, time.time() - d.last_seen_at))} ago")
    print(f"Pools:      {', '.join(d.pools) or '-'} ({d.pool_scope.value})")
    print(f"Nodes:      {d.nodes} schedulable, {_gpus(d.gpus)}, {d.allocated_gpus:g} allocated")
    for node in d.node_names:
        print(f"  {node}")
    print(f"Workloads:  {len(d.running)}")
    for w in d.running:
        print(f"  {w}")
    if d.burst is not None:
        held = sum(1 for n in d.burst_nodes if n.released_at is None)
        print(f"Rented:     {held} node(s) held, {len(d.burst_nodes) - held} given back in the last day")
        for n in d.burst_nodes:
            why = f" ({n.end_reason.value})" if n.end_reason is not None else ""
            print(f"  {n.name}  {n.department}  {n.phase.value}{why}  {n.node or '-'}  ${n.cost:,.2f}")


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


def department_burst(
    name: str,
    after: Annotated[
        float | None,
        typer.Option("--after", parser=duration_flag, help="Burst for work that has waited this long (30m)."),
    ] = None,
    budget: Annotated[float | None, typer.Option("--budget", help="Dollars a month it may spend on bursts.")] = None,
    paced: Annotated[
        bool | None,
        typer.Option("--paced/--no-paced", help="The budget accrues evenly over the month (default), or not."),
    ] = None,
    stop: Annotated[
        bool | None,
        typer.Option(
            "--stop-at-budget/--let-finish",
            help="At the budget, stop its work on rented nodes (default), or let it run to its end.",
        ),
    ] = None,
    off: Annotated[bool, typer.Option("--off", help="Never burst.")] = False,
    output: Output = OutputOpt,
) -> None:
    """When a department's waiting work may rent burst capacity, within what monthly budget (admins set it), and
    what it spends this month; with no option, show it. A setting not given keeps its value."""
    if off and (after is not None or budget is not None):
        fail("--off takes no --after or --budget", 2)
    try:
        DepartmentBurstSet(after_s=after, monthly_budget=budget)  # the flags checked before any call
    except ValidationError as e:
        fail("; ".join(f"--{_FLAGS[str(err['loc'][0])]}: {err['msg']}" for err in e.errors()), 2)
    with client() as c:
        got = c.department_burst(name)
        if off or any(v is not None for v in (after, budget, paced, stop)):
            body = DepartmentBurstSet(
                after_s=None if off else (got.after_s if after is None else after),
                monthly_budget=None if off else (got.monthly_budget if budget is None else budget),
                paced=got.paced if paced is None else paced,
                stop_at_budget=got.stop_at_budget if stop is None else stop,
            )
            got = c.set_department_burst(name, body)
    if output is Output.json:
        emit_json(got)
        return
    if got.monthly_budget is None:
        print(f"department {got.department}: never bursts")
    else:
        rules = (
            f"{'paced' if got.paced else 'not paced'}, {'stops at it' if got.stop_at_budget else 'lets work finish'}"
        )
        print(f"department {got.department}: bursts for work waiting {duration(got.after_s or 0)}, "
              f"within ${got.monthly_budget:,.2f} a month ({rules})")  # fmt: skip
    held = f"{got.nodes} node{'' if got.nodes == 1 else 's'} held"
    print(f"  this month: ${got.spent:,.2f} spent, ${got.forecast:,.2f} forecast; {held}, "
          f"${got.rate_per_hour:,.2f} an hour")  # fmt: skip
    if got.refused is not None:
        print(f"  refused at the last try: {got.refused}")


_FLAGS = {"after_s": "after", "monthly_budget": "budget"}
