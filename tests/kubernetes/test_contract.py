"""The kubernetes backend keeps the same contract as the local one (tests/backends/contract.py), one test per
promise, against a real API server with kwok playing the kubelet: no container runs, so a member writes no
output, and its run time and exit code come from its environment (tests/kubernetes/kwok-stages.yaml)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest

from gpupool.backends.base import DeviceGrant, LaunchSpec
from gpupool.backends.kubernetes.backend import KubernetesBackend, KubeSettings
from tests.backends.contract import BackendContract, Harness, Member
from tests.e2e.conftest import wait_for
from tests.kubernetes.cluster import Cluster

GRANT = (DeviceGrant(0, 1000, 81559, "H100", 81559),)


class TestKubernetesBackend(BackendContract):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, cluster: Cluster) -> Iterator[Harness]:
        warnings.simplefilter("ignore")
        (node,) = cluster.add_gpu_nodes(1, prefix="contract")
        backend = KubernetesBackend(KubeSettings(kubeconfig=str(cluster.kubeconfig)))
        ready = lambda: any(n.name == node and n.schedulable for n in backend.inventory())  # noqa: E731
        wait_for(ready, 30, "the node to be Ready")

        def spec(m: Member) -> LaunchSpec:
            env = {"RUN_FOR": f"{m.seconds:g}s"} | ({"EXIT_CODE": str(m.exit_code)} if m.exit_code else {})
            kind = "training" if m.port is None else "inference"
            return LaunchSpec(m.alloc, m.workload_id, "contract", "p", kind, ("run",), env, GRANT, node=node,
                              port=m.port, grace_s=5)  # fmt: skip

        try:
            yield Harness(backend, spec, output=False, sampled=False)
        finally:
            backend.close()
            cluster.reset()
