"""A relist (after 410 Gone) never shows a scheduling cycle its running pods as gone.

The API server here serves watches from etcd itself (no watch cache), so compacting etcd past a watch's
resourceVersion expires it, as a watch disconnected for long meets in production: the backend's resumed watch
is answered 410 Gone and it lists again. A real Controller cycle runs at the moment the relist holds the new
list and is building its view from it."""

from __future__ import annotations

import base64
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from gpupool.api.app import create_app
from gpupool.backends.fleet import Fleet
from gpupool.backends.kubernetes.backend import KubernetesBackend
from gpupool.models.schemas import ProjectCreate, WorkloadCreate
from gpupool.server import build
from gpupool.settings import Settings
from kubernetes import client
from tests.e2e.conftest import wait_for
from tests.kubernetes.cluster import Cluster, binaries
from tests.kubernetes.gate import Gate


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="gpupool-kube-"))
    c = Cluster(root, binaries(), apiserver_args=["--watch-cache=false"])
    try:
        yield c.start()
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


def compact_etcd(cluster: Cluster) -> int:
    """Compact etcd at its current revision (its JSON gateway): every older resourceVersion is gone."""
    etcd = f"http://127.0.0.1:{cluster.etcd_port}/v3/kv"
    head = httpx.post(f"{etcd}/range", json={"key": base64.b64encode(b"/").decode()}).json()["header"]
    revision = int(head["revision"])
    httpx.post(f"{etcd}/compaction", json={"revision": revision, "physical": True}).raise_for_status()
    return revision


def test_a_cycle_during_a_relist_after_410_sees_every_running_pod(cluster: Cluster, tmp_path: Path) -> None:
    cluster.add_gpu_nodes(1, prefix="relist")
    gate = Gate(cluster).open()
    settings = Settings(data_dir=tmp_path / "data", backend="kubernetes", kubeconfig=str(gate.kubeconfig),
                        gpus="fake:1xH100-80GB", public_url="http://127.0.0.1:8470")  # fmt: skip
    ctx, _ = build(settings)
    fleet, controller = ctx.backend, ctx.controller
    assert isinstance(fleet, Fleet)  # the server's backend is a fleet: its own cluster's, and no spoke here
    backend = fleet.home
    assert isinstance(backend, KubernetesBackend)
    token = (tmp_path / "data" / "admin-token").read_text().strip()
    api = TestClient(create_app(ctx), headers={"Authorization": f"Bearer {token}"})

    def post(path: str, body: Any) -> None:
        api.post(path, json=body.model_dump(mode="json", exclude_none=True)).raise_for_status()

    def states() -> dict[str, str]:
        return {w["name"]: w["state"] for w in api.get("/api/v1/workloads").json()["items"]}

    def pods() -> list[Any]:
        return list(client.CoreV1Api(cluster.api()).list_namespaced_pod("gpupool-steady").items)

    try:
        post("/api/v1/projects", ProjectCreate(name="steady", deserved_gpus=8, pool="h100"))
        names = [f"w{i}" for i in range(3)]
        for name in names:
            post("/api/v1/workloads", WorkloadCreate(project="steady", name=name, gpus=1, command=["sleep", "inf"]))
        wait_for(lambda: controller.cycle() is not None and set(states().values()) == {"running"}, 60,
                 "three workloads running")  # fmt: skip
        running = sorted(p.metadata.name for p in pods())
        assert backend.watch.lists == 1

        gate.cut()
        for bump in ("relist-a", "relist-b"):  # etcd keeps the compaction revision itself: go two past the watch's
            client.CoreV1Api(cluster.api()).create_namespace({"metadata": {"name": bump}})
        compact_etcd(cluster)
        in_window, resume = threading.Event(), threading.Event()
        to_dict: Callable[[Any], dict[str, Any]] = backend.watch._to_dict

        def building(obj: Any) -> dict[str, Any]:
            in_window.set()
            resume.wait(60)
            return to_dict(obj)

        backend.watch._to_dict = building
        gate.open()
        assert in_window.wait(60), "the resumed watch was not answered 410 and relisted"
        observed = backend.observe()
        controller.cycle()
        resume.set()
        wait_for(lambda: backend.watch.lists == 2, 30, "the relist to finish")
        backend.watch._to_dict = to_dict
        controller.cycle()

        assert observed is not None and {o.alive for o in observed.values()} == {True} and len(observed) == 3
        assert states() == dict.fromkeys(names, "running")
        reasons = [e["reason"] for n in names for e in api.get(f"/api/v1/workloads/{n}").json()["events"]]
        assert not [r for r in reasons if "unknown status" in r or "exited" in r]
        assert sorted(p.metadata.name for p in pods() if not p.metadata.deletion_timestamp) == running
    finally:
        backend.close()
        cluster.reset()
