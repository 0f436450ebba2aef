"""A real control plane (etcd, kube-apiserver, kwok) per test module, and gpupool servers on it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpupool.backends.kubernetes.backend import KubernetesBackend, KubeSettings
from tests.e2e.conftest import Server, Servers
from tests.kubernetes.cluster import Cluster, binaries


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

    def make(*args: str) -> Server:
        backend = ("--backend", "kubernetes", "--kubeconfig", str(cluster.kubeconfig))
        root = tmp_path / f"server{len(servers.started)}"
        root.mkdir()
        s = Server(root, None, "fake:1xH100-80GB", (*backend, *args))
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
