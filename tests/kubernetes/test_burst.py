"""Bursting to rented capacity under a budget, end to end: a hub with one GPU of its own and a burst cluster (a real
kube-apiserver with kwok) that starts with no node. The test plays cluster-autoscaler (`Autoscaler`): it watches
ProvisioningRequests, adds a kwok node the declared delay after each, marks the request provisioned, and removes a
request's node once the request is deleted. gpupool must ask only for work that waited past its department's
threshold, ask once though it crashes right after asking, give the node back once idle, refuse what the budget does
not cover, and stop the work on a department's nodes once its spending reaches the budget."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.backends.kubernetes.provisioning import DEPARTMENT, GROUP, NAMESPACE, PLURAL, REQUEST, VERSION
from kubernetes import client
from tests.e2e.conftest import Server, Servers, wait_for
from tests.kubernetes.cluster import Cluster, binaries
from tests.kubernetes.test_provisioning import install_crd, set_condition

DELAY_S = 2.0
THRESHOLD_S = 3.0
SETTINGS = {
    "GPUPOOL_CLUSTER_HEARTBEAT_S": "0.5",
    "GPUPOOL_BURST_INTERVAL_S": "0.5",
    # $360 per GPU-hour is 10 cents a second: a budget of $1 covers one 1-GPU node for the 6 s look-ahead (60
    # cents), not two, and is spent 10 s after the node is asked for.
    "GPUPOOL_BURST_LOOKAHEAD_S": "6",
}


class Autoscaler:
    """What cluster-autoscaler does with ProvisioningRequests, reduced to what gpupool sees: a node `delay_s` after
    each request, the request marked Provisioned; a deleted request's node removed (the node gpupool labelled as
    the request's, else the one made for it)."""

    def __init__(self, cluster: Cluster, delay_s: float) -> None:
        self.cluster = cluster
        self.delay_s = delay_s
        self.seen: dict[str, float] = {}
        """Each request, and when it was first seen."""
        self.departments: dict[str, str] = {}
        self.made: dict[str, str] = {}
        """Each request provisioned, and the node made for it."""
        self.removed: dict[str, bool] = {}
        """Each node removed, and whether it had been cordoned first."""
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        api = self.cluster.api()
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        while not self._stop.wait(0.1):
            try:
                self._tick(custom, core)
            except Exception as e:  # reported by the test, which fails on any
                self.errors.append(repr(e))

    def _tick(self, custom: client.CustomObjectsApi, core: client.CoreV1Api) -> None:
        try:
            items = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)["items"]
        except client.exceptions.ApiException as e:
            if e.status != 404:
                raise
            items = []
        now = time.time()
        live = set()
        for item in items:
            name = item["metadata"]["name"]
            live.add(name)
            self.seen.setdefault(name, now)
            self.departments[name] = item["metadata"]["labels"][DEPARTMENT]
            if name not in self.made and now - self.seen[name] >= self.delay_s:
                node = self.cluster.add_gpu_nodes(1, prefix=f"cloud-{len(self.made)}", gpus=1, pool="cloud")[0]
                self.made[name] = node
                set_condition(self.cluster, name, "Provisioned", "capacity is ready")
        for name, node in self.made.items():
            if name in live:
                continue
            nodes = core.list_node(label_selector=f"{REQUEST}={name}").items
            if not nodes:
                nodes = [
                    n for n in core.list_node().items if n.metadata.name == node and not n.metadata.labels.get(REQUEST)
                ]
            for n in nodes:
                if n.metadata.name not in self.removed:
                    self.removed[n.metadata.name] = bool(n.spec.unschedulable)
                    core.delete_node(n.metadata.name)

    def asked(self, department: str) -> list[str]:
        return sorted(n for n, d in self.departments.items() if d == department)


@pytest.fixture(scope="module")
def cloud() -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="gpupool-cloud-"))
    cluster = None
    try:
        cluster = Cluster(root, binaries()).start()
        install_crd(cluster)
        yield cluster
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def autoscaler(cloud: Cluster) -> Iterator[Autoscaler]:
    a = Autoscaler(cloud, DELAY_S)
    try:
        yield a
    finally:
        a.close()
        cloud.reset()
        assert a.errors == []


@pytest.fixture
def hub(tmp_path: Path, cloud: Cluster, autoscaler: Autoscaler) -> Iterator[Server]:
    """A hub with one simulated GPU of its own, the burst cluster added, and its one GPU taken by a job."""
    servers = Servers(tmp_path)
    root = tmp_path / "hub"
    root.mkdir()
    s = Server(root, None, "fake:1xH100-80GB", ())
    s.env |= SETTINGS
    s.args += ("--public-url", s.url)
    servers.started.append(s)
    try:
        s.start()
        burst = ("--burst-price", "360", "--burst-max-gpus", "2", "--burst-delay", "2s", "--burst-idle", "4s")
        s.cli("cluster", "add", "cloud", "--kubeconfig", str(cloud.kubeconfig), *burst, "--burst-node-gpus", "1")
        wait_for(
            lambda: {c["name"]: c["status"] for c in s.json("cluster", "list")}.get("cloud") == "up", 60, "cloud up"
        )
        for department, project in (("research", "vision"), ("labs", "bio")):
            s.cli("department", "create", department)
            s.cli("project", "create", project, "--department", department)
        s.cli("submit", "-p", "vision", "--name", "home", "--gpus", "1", "--", "sleep", "inf")
        s.wait_state("home", "running", timeout=60)
        yield s
    finally:
        servers.close()


def _restart(s: Server, failpoints: str | None) -> None:
    """Start the hub again (killed, if it still runs), with these failpoints armed."""
    s.kill()
    s.env.pop("GPUPOOL_FAILPOINTS", None)
    if failpoints:
        s.env["GPUPOOL_FAILPOINTS"] = failpoints
    s.start()


def _rented(s: Server) -> list[dict[str, Any]]:
    """The burst cluster's rented nodes, as `cluster describe` shows them."""
    return list(s.json("cluster", "describe", "cloud")["burst_nodes"])


def _node(s: Server, name: str) -> str:
    return str(s.workload(name)["allocations"][0]["node"])


def test_a_burst_comes_after_the_threshold_once_though_the_hub_crashes_and_goes_back_when_idle(
    hub: Server, cloud: Cluster, autoscaler: Autoscaler
) -> None:
    s = hub
    s.cli("department", "burst", "research", "--after", "3", "--budget", "100", "--no-paced")
    _restart(s, "burst.after-ask=kill")
    s.cli("submit", "-p", "vision", "--name", "waits", "--gpus", "1", "--", "sleep", "inf")
    submitted = s.workload("waits")["created_at"]
    # The hub asks once the job has waited 3 s, and dies right after asking (a failpoint): the store says the ask
    # may have been made. Restarted, it asks again by the same name, which makes no second request.
    wait_for(lambda: s.proc is not None and s.proc.poll() is not None, 60, "the hub to die right after asking")
    _restart(s, None)
    s.wait_state("waits", "running", timeout=60)
    assert autoscaler.asked("research") == sorted(autoscaler.seen)
    [request] = autoscaler.asked("research")
    assert autoscaler.seen[request] - submitted >= THRESHOLD_S
    node = _node(s, "waits")
    assert node == f"cloud/{autoscaler.made[request]}"
    labels = client.CoreV1Api(cloud.api()).read_node(node.split("/", 1)[1]).metadata.labels
    assert labels["gpupool.io/burst-request"] == request
    assert "/" not in _node(s, "home")

    # Idle for 4 s, the node goes back: cordoned, its request deleted, the autoscaler removes it. The hub dies right
    # after giving it back, before writing that down: restarted, it gives it back again, which is already done.
    _restart(s, "burst.after-give-back=kill")
    s.cli("cancel", "waits")
    wait_for(lambda: s.proc is not None and s.proc.poll() is not None, 60, "the hub to die right after giving back")
    _restart(s, None)
    wait_for(lambda: autoscaler.removed, 60, "the idle node to be given back")
    assert autoscaler.removed == {autoscaler.made[request]: True}
    assert autoscaler.asked("research") == [request]
    rented = wait_for(lambda: _rented(s)[0]["phase"] == "released" and _rented(s), 30, "the release written down")
    assert [(n["name"], n["department"], n["end_reason"], n["node"]) for n in rented] == [
        (request, "research", "idle", node)
    ]
    shown = s.json("department", "burst", "research")
    assert shown["nodes"] == 0 and shown["refused"] is None
    assert 0 < shown["spent"] < 100


def test_a_budget_refuses_what_it_cannot_cover_and_stops_work_once_spent(hub: Server, autoscaler: Autoscaler) -> None:
    s = hub
    s.cli("department", "burst", "labs", "--after", "3", "--budget", "1", "--no-paced")
    s.cli("submit", "-p", "bio", "--name", "first", "--gpus", "1", "--", "sleep", "inf")
    s.cli("submit", "-p", "bio", "--name", "second", "--gpus", "1", "--", "sleep", "inf")
    # The budget covers one node for the look-ahead, not two: the oldest job gets one, the other is refused.
    s.wait_state("first", "running", timeout=60)
    assert _node(s, "first").startswith("cloud/")
    refused = wait_for(lambda: (b := s.json("department", "burst", "labs"))["refused"] and b, 30, "the refusal")
    assert refused["refused"] == "over-budget"
    assert s.workload("second")["state"] == "pending"
    # Spending reaches $1 ten seconds after the ask: the job there is stopped and requeued, and the node, empty,
    # goes back at once; nothing more is asked for.
    stopped = wait_for(lambda: (w := s.workload("first"))["attempts"][0]["outcome"] != "running" and w, 60, "a stop")
    assert [(a["outcome"], a["reason"]) for a in stopped["attempts"][:1]] == [("requeued", "burst-budget")]
    assert any(e["reason"].startswith("department labs reached its burst budget") for e in stopped["events"])
    wait_for(lambda: autoscaler.removed, 60, "the node to be given back")
    assert list(autoscaler.removed.values()) == [True]
    assert len(autoscaler.asked("labs")) == 1
    rented = wait_for(lambda: _rented(s)[0]["phase"] == "released" and _rented(s), 30, "the release written down")
    assert [(n["department"], n["end_reason"]) for n in rented] == [("labs", "budget")]
    after = s.json("department", "burst", "labs")
    assert after["spent"] >= 1.0 and after["nodes"] == 0 and after["refused"] == "over-budget"
    assert [s.workload(n)["state"] for n in ("first", "second")] == ["preempted", "pending"]
