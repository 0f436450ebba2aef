"""A real control plane (etcd, kube-apiserver, kwok) per test module, gpupool servers on it, and on request the
ecosystem's controllers (kube-controller-manager for Jobs, JobSet's manager) with a namespace's workloads."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpupool.backends.kubernetes.backend import KubernetesBackend, KubeSettings
from tests.e2e.conftest import Server, Servers
from tests.e2e.conftest import browser as browser
from tests.kubernetes.cluster import Cluster, binaries
from tests.kubernetes.controllers import ControllerManager, JobSetManager, Workloads


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="gpupool-kube-"))
    c = Cluster(root, binaries())
    try:
        yield c.start()
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def kube_server(tmp_path: Path, cluster: Cluster) -> Iterator[Callable[..., Server]]:
    servers = Servers(tmp_path)

    def make(*args: str, env: dict[str, str] | None = None) -> Server:
        backend = ("--backend", "kubernetes", "--kubeconfig", str(cluster.kubeconfig))
        root = tmp_path / f"server{len(servers.started)}"
        root.mkdir()
        s = Server(root, None, "fake:1xH100-80GB", (*backend, *args))
        s.env |= env or {}
        s.args += ("--public-url", s.url)  # where pods fetch their code: the port is only known now
        servers.started.append(s)
        return s.start()

    yield make
    servers.close()
    cluster.reset()


@pytest.fixture
def backend(cluster: Cluster) -> Iterator[KubernetesBackend]:
    """The backend on its own against the cluster, for tests that drive launches directly."""
    b = KubernetesBackend(KubeSettings(kubeconfig=str(cluster.kubeconfig)))
    try:
        yield b
    finally:
        b.close()
        cluster.reset()


@pytest.fixture(scope="module")
def kube_controllers(cluster: Cluster) -> Iterator[ControllerManager]:
    """kube-controller-manager on the module's cluster, running the Job controller and the garbage collector."""
    m = ControllerManager(cluster).start()
    try:
        yield m
    finally:
        m.stop()


@pytest.fixture(scope="module")
def jobset_controller(kube_controllers: ControllerManager) -> Iterator[JobSetManager]:
    """JobSet's controller manager (CRD applied, webhooks registered and served) beside kube_controllers."""
    m = JobSetManager(kube_controllers.cluster).start()
    try:
        yield m
    finally:
        m.stop()


@pytest.fixture
def workloads(cluster: Cluster, kube_controllers: ControllerManager) -> Iterator[Workloads]:
    """Jobs, JobSets and pods in the default namespace; every one of them, and every node, is gone after the test."""
    w = Workloads(cluster)
    try:
        yield w
    finally:
        w.clear()
        cluster.reset()
