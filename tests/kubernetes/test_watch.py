"""The backend's view of its pods against a real API server: nothing concluded before the first list or while
the watch has been failing too long; a watch the server ends is resumed, not relisted; a pod just created is
not taken for gone before the watch shows it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpupool.backends.base import DeviceGrant, LaunchSpec, Observed
from gpupool.backends.kubernetes.backend import KubernetesBackend, KubeSettings
from kubernetes import client
from tests.e2e.conftest import wait_for
from tests.kubernetes.cluster import Cluster
from tests.kubernetes.gate import Gate


def spec(alloc: str, node: str) -> LaunchSpec:
    grant = (DeviceGrant(0, 1000, 81559, "H100", 81559),)
    return LaunchSpec(alloc, 1, alloc, "watch", "batch", ("sleep", "inf"), {}, grant, node=node)


@contextmanager
def backend(kubeconfig: Path, cluster: Cluster, **settings: Any) -> Iterator[KubernetesBackend]:
    b = KubernetesBackend(KubeSettings(kubeconfig=str(kubeconfig), dcgm=None, **settings))
    try:
        yield b
    finally:
        b.close()
        cluster.reset()


def phase(b: KubernetesBackend, alloc: str) -> str | None:
    with b.watch.lock:
        pod = b.watch.pods.get(alloc)
    return None if pod is None else (pod.get("status") or {}).get("phase")


def test_nothing_is_concluded_before_the_first_list_or_once_the_watch_has_failed_too_long(cluster: Cluster) -> None:
    (node,) = cluster.add_gpu_nodes(1, prefix="sync")
    gate = Gate(cluster)  # not open: the API server cannot be reached yet
    with backend(gate.kubeconfig, cluster, sync_wait_s=0, stale_after_s=2) as b:
        assert b.observe() is None
        assert b.watch.lists == 0
        gate.open()
        wait_for(lambda: b.observe() is not None, 30, "the first list")
        b.launch(spec("s-1", node))
        wait_for(lambda: phase(b, "s-1") == "Running", 30, "the watch to show the pod running")
        assert b.observe() == {"s-1": Observed("s-1", True)}
        gate.cut()
        wait_for(lambda: b.observe() is None, 30, "the view to be called stale")
        gate.open()
        wait_for(lambda: b.observe() is not None, 30, "the watch to resume")
        assert b.observe() == {"s-1": Observed("s-1", True)}
        assert b.watch.lists == 1  # resumed from its resourceVersion, which the API server still had


def test_a_watch_the_server_ends_is_resumed_without_a_list(cluster: Cluster) -> None:
    (node,) = cluster.add_gpu_nodes(1, prefix="resume")
    with backend(cluster.kubeconfig, cluster, watch_timeout_s=1) as b:
        wait_for(lambda: b.watch.watches >= 4, 60, "the API server to end three watches")
        assert b.watch.lists == 1
        b.launch(spec("r-1", node))
        wait_for(lambda: phase(b, "r-1") == "Running", 30, "a resumed watch to show the new pod running")
        assert b.watch.lists == 1
        assert b.watch.unseen == {}


def test_a_pod_the_watch_has_not_shown_yet_is_alive_until_the_bound(cluster: Cluster) -> None:
    (node,) = cluster.add_gpu_nodes(1, prefix="unseen")
    core = client.CoreV1Api(cluster.api())
    with backend(cluster.kubeconfig, cluster, unseen_for_s=3) as b:
        b.watch.stop()  # from here on the watch shows nothing: every launch stays unseen
        b.launch(spec("u-1", node))
        b.launch(spec("u-2", node))
        assert b.observe() == {"u-1": Observed("u-1", True), "u-2": Observed("u-2", True)}
        names = {p.metadata.name for p in core.list_namespaced_pod("gpupool-watch").items}
        assert names == {"u-1-u-1", "u-2-u-2"}
        b.stop("u-1", force=True)  # stopped by the name launch() gave it, though the watch never showed it
        wait_for(lambda: "u-1-u-1" not in {p.metadata.name for p in core.list_namespaced_pod("gpupool-watch").items},
                 30, "u-1's pod to be deleted")  # fmt: skip
        wait_for(lambda: b.observe() == {}, 30, "the presumption of life to lapse")
