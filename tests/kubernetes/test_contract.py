"""The kubernetes backend passes the same contract as the local one, against the real API server."""

from __future__ import annotations

import warnings

from gpupool.backends.base import DeviceGrant, LaunchSpec
from gpupool.backends.kubernetes.backend import KubernetesBackend, KubeSettings
from tests.backends.contract import Harness, run_contract
from tests.e2e.conftest import wait_for
from tests.kubernetes.cluster import Cluster


def test_the_kubernetes_backend_keeps_the_contract(cluster: Cluster) -> None:
    warnings.simplefilter("ignore")
    (node,) = cluster.add_gpu_nodes(1, prefix="contract")
    backend = KubernetesBackend(KubeSettings(kubeconfig=str(cluster.kubeconfig)))
    wait_for(lambda: any(n.name == node and n.schedulable for n in backend.inventory()), 30, "the node to be Ready")

    def spec(alloc: str, seconds: float, code: int) -> LaunchSpec:
        env = {"RUN_FOR": f"{seconds:g}s"} | ({"EXIT_CODE": str(code)} if code else {})
        grant = (DeviceGrant(0, 1000, 81559, "H100", 81559),)
        return LaunchSpec(alloc, 1, "contract", "p", "training", ("run",), env, grant, node=node, grace_s=5)

    try:
        run_contract(Harness(backend, spec), "k")
    finally:
        backend.close()
