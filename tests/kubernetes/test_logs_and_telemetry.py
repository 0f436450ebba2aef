"""What a member says and how busy its GPUs are, on a real API server: its log followed as it is written (kwok
serves it as a kubelet does), and GPU telemetry from dcgm-exporter pods scraped through the API server's pod
proxy (the exporter serves simulated GPUs)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from gpupool.backends.base import DeviceGrant, DeviceSample, LaunchSpec, MemberSample, Sample
from gpupool.backends.kubernetes.backend import KubernetesBackend, KubeSettings
from gpupool.backends.kubernetes.dcgm import DcgmSettings
from gpupool.backends.kubernetes.manifests import pod_name
from kubernetes import client
from tests.e2e.conftest import wait_for
from tests.kubernetes.cluster import LOG_NAMESPACE, Cluster
from tests.kubernetes.dcgm_exporter import Exporter

H100 = 81559


@pytest.fixture(autouse=True)
def proxyable(cluster: Cluster) -> None:
    if cluster.host.startswith("127."):
        pytest.skip("this machine has no address off loopback, and the API server proxies to none on it")


def grants(*parts: tuple[int, int]) -> tuple[DeviceGrant, ...]:
    return tuple(DeviceGrant(i, milli, H100 * milli // 1000, "H100", H100) for i, milli in parts)


def spec(alloc: str, wid: int, project: str, node: str, devices: tuple[DeviceGrant, ...]) -> LaunchSpec:
    return LaunchSpec(alloc, wid, alloc, project, "batch", ("sleep", "inf"), {}, devices, node=node)


def running(b: KubernetesBackend, *allocs: str) -> bool:
    with b.watch.lock:
        return all((b.watch.pods.get(a, {}).get("status") or {}).get("phase") == "Running" for a in allocs)


def cri(line: str) -> str:
    """A line as a container runtime writes it to the kubelet's log file."""
    return f"{datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%S.%fZ')} stdout F {line}\n"


class Follower:
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.data = b""
        self._thread = threading.Thread(target=self._read, args=(chunks,), daemon=True)
        self._thread.start()

    def _read(self, chunks: Iterator[bytes]) -> None:
        for chunk in chunks:
            self.data += chunk

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()


def test_a_members_log_is_followed_as_it_is_written(cluster: Cluster) -> None:
    (node,) = cluster.add_gpu_nodes(1, prefix="logs")
    cluster.container_log.write_text(cri("line one"))
    b = KubernetesBackend(KubeSettings(kubeconfig=str(cluster.kubeconfig), dcgm=None))
    try:
        project = LOG_NAMESPACE.removeprefix("gpupool-")
        b.launch(spec("l-1", 41, project, node, grants((0, 1000))))
        wait_for(lambda: running(b, "l-1"), 30, "the member to run")
        assert b.read_log(41, 0, 0, 1 << 20) == b"line one\n"
        assert b.read_log(41, 0, 5, 3) == b"one"
        assert b.read_log(41, 1, 0, 1 << 20) == b""  # no such member
        whole, tail = Follower(b.follow_log(41, 0, 0)), Follower(b.follow_log(41, 0, 5))
        wait_for(lambda: whole.data == b"line one\n" and tail.data == b"one\n", 30, "what is written so far")
        with cluster.container_log.open("a") as f:
            f.write(cri("line two"))
        wait_for(lambda: whole.data == b"line one\nline two\n", 30, "the new line, on the open stream")
        wait_for(lambda: tail.data == b"one\nline two\n", 30, "the new line, after the offset")
        assert not whole.done and not tail.done
        b.stop("l-1", force=True)
        wait_for(lambda: whole.done and tail.done, 30, "following to end with the member")
        assert list(b.follow_log(41, 0, 0)) == []  # its pod is gone
    finally:
        b.close()
        cluster.reset()


def test_gpu_telemetry_comes_from_the_dcgm_exporter_on_each_node(cluster: Cluster) -> None:
    nodes = cluster.add_gpu_nodes(2, prefix="dcgm", gpus=4)
    core = client.CoreV1Api(cluster.api())
    namespace = "gpu-operator"
    core.create_namespace({"metadata": {"name": namespace}})
    exporters = {n: Exporter(cluster.host, n, 4) for n in nodes}
    for n, e in exporters.items():
        container = {"name": "nvidia-dcgm-exporter", "image": "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3",
                     "ports": [{"name": "metrics", "containerPort": e.port}]}  # fmt: skip
        body = {
            "metadata": {"name": f"nvidia-dcgm-exporter-{n}", "labels": {"app": "nvidia-dcgm-exporter"}},
            "spec": {"nodeName": n, "containers": [container]},
        }
        core.create_namespaced_pod(namespace, body)
    settings = DcgmSettings(namespace=namespace, interval_s=0.5)
    b = KubernetesBackend(KubeSettings(kubeconfig=str(cluster.kubeconfig), dcgm=settings))
    try:
        assert b.sample() == Sample({}, (), modelled=False)  # no exporter has answered yet
        b.inventory()
        whole = spec("t-whole", 51, "telemetry", nodes[0], grants((0, 1000), (1, 1000)))
        half = spec("t-half", 52, "telemetry", nodes[0], grants((2, 500)))
        quarter = spec("t-quarter", 53, "telemetry", nodes[0], grants((2, 250)))
        idle = spec("t-idle", 54, "telemetry", nodes[1], grants((0, 1000)))
        for s in (whole, half, quarter, idle):
            b.launch(s)
        wait_for(lambda: running(b, "t-whole", "t-half", "t-quarter", "t-idle"), 30, "the members to run")
        for n in nodes:  # kwok gives pods no address: the exporters' pods are where the simulated exporters listen
            wait_for(lambda n=n: core.read_namespaced_pod(f"nvidia-dcgm-exporter-{n}", namespace).status.phase
                     == "Running", 30, "the exporter pod to run")  # fmt: skip
            status = {"podIP": cluster.host, "podIPs": [{"ip": cluster.host}]}
            core.patch_namespaced_pod_status(f"nvidia-dcgm-exporter-{n}", namespace, {"status": status})
        reservation = wait_for(lambda: b.watch.reservations.get((nodes[0], 2)), 30, "the reservation pod")
        # What the device plugin would have given each pod, and how busy the simulated GPUs are.
        e0, e1 = exporters[nodes[0]], exporters[nodes[1]]
        members = "gpupool-telemetry"
        e0.gpus[0].pod = e0.gpus[1].pod = (members, pod_name(whole))
        e0.gpus[0].util_pct, e0.gpus[0].fb_used_mib = 90, 30000
        e0.gpus[1].util_pct, e0.gpus[1].fb_used_mib = 70, 20000
        e0.gpus[2].pod = ("gpupool-system", reservation)
        e0.gpus[2].util_pct, e0.gpus[2].fb_used_mib = 60, 12000
        e1.gpus[0].pod = (members, pod_name(idle))
        e1.gpus[0].fb_used_mib = 500
        expected = Sample(
            {
                "t-whole": MemberSample(80, 50000),
                "t-half": MemberSample(60, 8000),  # the device's utilisation; its memory split by share
                "t-quarter": MemberSample(60, 4000),
                "t-idle": MemberSample(0, 500),
            },
            tuple(
                DeviceSample(n, g.index, exporters[n].uuid(g.index), "H100-80GB-HBM3", g.util_pct, g.fb_used_mib)
                for n in nodes
                for g in exporters[n].gpus
            ),
            modelled=False,
        )
        wait_for(lambda: b.sample() == expected, 30, "the exporters' readings, mapped to members")
        e0.gpus[0].util_pct = e0.gpus[1].util_pct = 0  # the whole-GPU member goes idle
        wait_for(lambda: b.sample().members["t-whole"] == MemberSample(0, 50000), 30, "the member to read idle")
    finally:
        b.close()
        for e in exporters.values():
            e.close()
        core.delete_namespace(namespace)
        cluster.reset()
