"""The kubernetes backend keeps the same contract as the local one (tests/backends/contract.py), one test per
promise, against a real API server with kwok playing the kubelet: no container runs, so a member's run time and
exit code come from its environment (tests/kubernetes/kwok-stages.yaml), and what it says is what kwok serves as
the log of every pod in LOG_NAMESPACE (where this machine has an address the API server may proxy to)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from gpupool.backends.base import DeviceGrant, LaunchSpec
from gpupool.backends.kubernetes.backend import KubernetesBackend, KubeSettings
from tests.backends.contract import BackendContract, Harness, Member
from tests.e2e.conftest import wait_for
from tests.kubernetes.cluster import LOG_NAMESPACE, Cluster

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

        output = not cluster.host.startswith("127.")

        def spec(m: Member) -> LaunchSpec:
            env = {"RUN_FOR": f"{m.seconds:g}s"} | ({"EXIT_CODE": str(m.exit_code)} if m.exit_code else {})
            kind = "training" if m.port is None else "inference"
            project = "p"
            if output and m.says is not None:  # as a container runtime writes it to the kubelet's log file
                stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                cluster.container_log.write_text(f"{stamp} stdout F {m.says}\n")
                project = LOG_NAMESPACE.removeprefix("gpupool-")
            return LaunchSpec(m.alloc, m.workload_id, "contract", project, kind, ("run",), env, GRANT, node=node,
                              port=m.port, grace_s=5)  # fmt: skip

        try:
            yield Harness(backend, spec, output=output, sampled=False)
        finally:
            backend.close()
            cluster.reset()
