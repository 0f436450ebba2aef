"""One hub over its own host (the local backend, simulated GPUs) and two real Kubernetes clusters, each with its own
etcd, kube-apiserver and kwok: work spreads across them, a gang stays in one, a cluster whose API server stops is
marked down and its work moves on per policy, and when it comes back no attempt runs twice, though the hub itself
crashed in between."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from kubernetes import client
from tests.e2e.conftest import Server, Servers, wait_for
from tests.e2e.test_portal import admin_page
from tests.kubernetes.cluster import Cluster, binaries

HEARTBEAT = {"GPUPOOL_CLUSTER_HEARTBEAT_S": "0.5", "GPUPOOL_CLUSTER_DOWN_AFTER_S": "5"}


@pytest.fixture(scope="module")
def clusters() -> Iterator[dict[str, Cluster]]:
    roots = {name: Path(tempfile.mkdtemp(prefix=f"gpupool-{name}-")) for name in ("east", "west")}
    started: dict[str, Cluster] = {}
    try:
        for name, root in roots.items():
            started[name] = Cluster(root, binaries()).start()
        yield started
    finally:
        for c in started.values():
            c.stop()
        for root in roots.values():
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def hub(tmp_path: Path, clusters: dict[str, Cluster]) -> Iterator[Server]:
    """A hub with two simulated GPUs of its own, and the two clusters added as spokes, each one empty node of 4 GPUs."""
    servers = Servers(tmp_path)
    root = tmp_path / "hub"
    root.mkdir()
    s = Server(root, None, "fake:2xH100-80GB", ())
    s.env |= HEARTBEAT
    s.args += ("--public-url", s.url)  # where a spoke's pods fetch their code
    servers.started.append(s)
    try:
        for name, c in clusters.items():
            c.add_gpu_nodes(1, prefix=name, gpus=4)
        s.start()
        for name, c in clusters.items():
            s.cli("cluster", "add", name, "--kubeconfig", str(c.kubeconfig))
        wait_for(lambda: _up(s) == {"home", "east", "west"}, 60, "both spokes up with their nodes")
        s.cli("project", "create", "vision", "--deserved-gpus", "2")
        yield s
    finally:
        servers.close()
        for c in clusters.values():
            c.reset()


def _up(s: Server) -> set[str]:
    return {c["name"] for c in s.json("cluster", "list") if c["status"] == "up" and c["gpus"]}


def _clusters_of(s: Server, name: str) -> list[str]:
    """The cluster of each member of the workload's current attempt, by member."""
    allocs = s.workload(name)["allocations"]
    return [a["node"].split("/", 1)[0] if "/" in a["node"] else "home" for a in allocs]


def _pods(c: Cluster, workload: str) -> list[Any]:
    """The workload's pods on a cluster that are not being deleted."""
    pods = client.CoreV1Api(c.api()).list_pod_for_all_namespaces(label_selector=f"gpupool.io/workload={workload}")
    return [p for p in pods.items if p.metadata.deletion_timestamp is None]


def test_work_spreads_over_the_clusters_and_a_gang_stays_in_one(
    hub: Server, clusters: dict[str, Cluster], browser: Browser
) -> None:
    s = hub
    for name, gpus in (("a", "4"), ("b", "4"), ("c", "2")):
        s.cli("submit", "-p", "vision", "--name", name, "--gpus", gpus, "--", "sleep", "inf")
    for name in ("a", "b", "c"):
        s.wait_state(name, "running", timeout=60)
    assert sorted(_clusters_of(s, n)[0] for n in ("a", "b", "c")) == ["east", "home", "west"]
    listed = {c["name"]: c for c in s.json("cluster", "list")}
    assert {n: (c["gpus"], c["allocated_gpus"], c["workloads"]) for n, c in listed.items()} == {
        "home": (2, 2.0, 1),
        "east": (4, 4.0, 1),
        "west": (4, 4.0, 1),
    }
    # The portal's GPU map, one group per cluster.
    page = admin_page(browser, s.url, s.admin_token)
    page.click("nav a[data-page=cluster]")
    for cluster, gpus in (("east", 4), ("home", 2), ("west", 4)):
        group = page.locator(f"#gpu-map [data-cluster={cluster}]")
        expect(group.locator("h3").first).to_have_text(f"Cluster {cluster} {gpus} GPUs")
        expect(group).to_contain_text("GPU 0")
    expect(page.locator("#gpu-map [data-cluster=west]")).to_contain_text("west/west-000")
    expect(page.locator("#gpu-map [data-cluster=east]")).not_to_contain_text("west/")
    expect(page.locator("#gpu-map [data-cluster=home]")).not_to_contain_text("/")
    page.close()
    for name in ("a", "b", "c"):
        s.cli("cancel", name)
    for name in ("a", "b", "c"):
        s.wait_state(name, "cancelled", timeout=60)

    # Two members of 4 GPUs, and no cluster with two such nodes: refused at once, though two clusters could.
    gang = ("submit", "-p", "vision", "--name", "gang", "--workers", "2", "--gpus", "4", "--", "sleep", "inf")
    refused = s.cli(*gang, check=False)
    assert refused.returncode == 1
    assert "in one pool of one cluster (a gang never spans pools or clusters)" in refused.stderr
    # West grows a node, and a job holds one of west's: east's free node and west's would hold the gang; it waits.
    clusters["west"].add_gpu_nodes(1, prefix="west-more", gpus=4)
    wait_for(lambda: {c["name"]: c["gpus"] for c in s.json("cluster", "list")}["west"] == 8, 30, "west's new node")
    s.cli("submit", "-p", "vision", "--name", "holder", "--gpus", "4", "--cluster", "west", "--", "sleep", "inf")
    s.wait_state("holder", "running", timeout=60)
    s.cli(*gang)
    pending = wait_for(lambda: (w := s.workload("gang"))["reason_code"] and w, 30, "the gang's reason")
    assert pending["state"] == "pending" and pending["reason_code"] == "gang-unplaceable", pending["reason"]
    s.cli("cancel", "holder")
    s.wait_state("gang", "running", timeout=60)
    assert _clusters_of(s, "gang") == ["west", "west"]
    assert len(_pods(clusters["west"], "gang")) == 2 and _pods(clusters["east"], "gang") == []
    described = s.cli("cluster", "describe", "west").stdout.splitlines()
    assert described[:2] == ["Cluster:    west (kubernetes)", "Status:     up"]
    assert "  west/west-000" in described and "  west/west-more-000" in described and "  vision/gang" in described

    # A workload that names a cluster runs there only.
    s.cli("submit", "-p", "vision", "--name", "pinned", "--gpus", "1", "--cluster", "east", "--", "sleep", "inf")
    s.wait_state("pinned", "running", timeout=60)
    assert _clusters_of(s, "pinned") == ["east"]
    refused = s.cli("submit", "-p", "vision", "--gpus", "1", "--cluster", "north", "--", "true", check=False)
    assert refused.returncode == 1
    assert "unknown cluster 'north'; clusters: east, home, west" in refused.stderr
    bad = s.cli("submit", "-p", "vision", "--on-cluster-lost", "soon", "--", "true", check=False)
    assert bad.returncode == 2 and "--on-cluster-lost 'soon': 'wait' or a duration like 10m" in bad.stderr


def test_a_cluster_gone_down_takes_no_work_its_work_moves_per_policy_and_nothing_runs_twice_on_its_return(
    hub: Server, clusters: dict[str, Cluster]
) -> None:
    s = hub
    east, west = clusters["east"], clusters["west"]
    # Both on east: one may move (requeued after 2 s down), one waits for east (a notebook's files would).
    s.cli("submit", "-p", "vision", "--name", "mover", "--gpus", "2", "--cluster", "east", "--cluster", "west",
          "--on-cluster-lost", "2s", "--", "sleep", "inf")  # fmt: skip
    s.cli("submit", "-p", "vision", "--name", "waiter", "--gpus", "2", "--cluster", "east",
          "--on-cluster-lost", "wait", "--", "sleep", "inf")  # fmt: skip
    for name in ("mover", "waiter"):
        s.wait_state(name, "running", timeout=60)
        assert _clusters_of(s, name) == ["east"]
    first = {p.metadata.name for p in _pods(east, "mover")}
    assert len(first) == 1

    east.stop_api()
    try:
        wait_for(lambda: {c["name"]: c["status"] for c in s.json("cluster", "list")}["east"] == "down", 30, "east down")
        moved = wait_for(lambda: (w := s.workload("mover"))["state"] == "running" and len(w["attempts"]) == 2 and w,
                         60, "mover to run again")  # fmt: skip
        assert [(a["outcome"], a["reason"]) for a in moved["attempts"][:1]] == [("requeued", "cluster-lost")]
        assert any(e["reason"].startswith("cluster east was down for") for e in moved["events"]), moved["events"]
        assert _clusters_of(s, "mover") == ["west"]
        waiting = s.workload("waiter")
        assert waiting["state"] == "running" and len(waiting["attempts"]) == 1  # it waits, as it asked
        # East takes no new work while down: a job that may only run there waits.
        s.cli("submit", "-p", "vision", "--name", "late", "--gpus", "1", "--cluster", "east", "--", "sleep", "inf")
        late = wait_for(lambda: (w := s.workload("late"))["reason_code"] and w, 30, "late's reason")
        assert late["state"] == "pending"
        # The hub crashes and starts again while east is still down: what it left behind there is in the store.
        s.kill()
        s.start()
        wait_for(lambda: {c["name"]: c["status"] for c in s.json("cluster", "list")}["east"] == "down", 30, "east down")
        assert s.workload("mover")["state"] == "running" and _clusters_of(s, "mover") == ["west"]
    finally:
        east.start_api()

    wait_for(lambda: "east" in _up(s), 60, "east up again")
    # The copy of mover that ran on east all along is stopped: one live copy, on west.
    wait_for(lambda: _pods(east, "mover") == [], 60, "the stale copy on east to be stopped")
    assert len(_pods(west, "mover")) == 1
    assert s.workload("mover")["state"] == "running"
    # The waiter carried on where it was; the late job starts there now.
    assert s.workload("waiter")["state"] == "running" and _clusters_of(s, "waiter") == ["east"]
    assert len(_pods(east, "waiter")) == 1
    s.wait_state("late", "running", timeout=60)
    assert _clusters_of(s, "late") == ["east"]
