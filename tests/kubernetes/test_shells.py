"""Shells on the Kubernetes backend, against a real kube-apiserver. No kubelet runs here: kwok plays the nodes
and answers the API server's exec and attach for them, with nothing configured to run. What is proven is that
the server's sessions reach the API server's subresources of the member's own pod and container, and that its
refusal reaches the user as the cluster said it, not as a traceback."""

from __future__ import annotations

from collections.abc import Callable

from tests.e2e.conftest import Server, wait_for
from tests.kubernetes.cluster import Cluster


def test_exec_and_attach_reach_the_members_pod_and_say_why_the_cluster_refused(
    cluster: Cluster, kube_server: Callable[..., Server]
) -> None:
    (node,) = cluster.add_gpu_nodes(1, prefix="sh")
    s = kube_server()
    wait_for(lambda: any(n["name"] == node and n["schedulable"] for n in s.json("nodes")), 30, "the node")
    s.cli("project", "create", "lab", "--deserved-gpus", "8", "--pool", "h100")
    s.cli("submit", "-p", "lab", "--name", "job", "--gpus", "1", "--", "sleep", "inf")
    s.wait_state("job", "running")
    # kwok answers for the kubelet: the stream reached the member's own pod and container, which has no exec
    # configured there; the CLI says what the cluster said.
    done = s.cli("exec", "job", "--", "true", check=False)
    said = 'error executing command in container: no exec found for container "main" in pod "gpupool-lab/job-1-0-0"'
    assert (done.returncode, done.stdout, done.stderr) == (
        1, "", f"the cluster ended the session: Internal error occurred: Internal error occurred: {said}\n"
    )  # fmt: skip
    attached = s.cli("attach", "job", check=False)
    said = 'error attaching to container: no attaches found for container "main" in pod "gpupool-lab/job-1-0-0"'
    assert (attached.returncode, attached.stdout, attached.stderr) == (
        1, "", f"the cluster ended the session: Internal error occurred: Internal error occurred: {said}\n"
    )  # fmt: skip
    trail = [(a.object, a.action, a.status) for a in s.client().audit(limit=20) if "rank" in a.action]
    assert ("workload/job", "exec rank 0: true", 101) in trail
    s.cli("cancel", "job")
