"""Shells on the Kubernetes backend, against a real kube-apiserver. No kubelet runs here: kwok plays the nodes
and answers the API server's exec and attach for them, with nothing configured to run. What is proven is that
the server's sessions reach the API server's subresources of the member's own pod and container, and that its
refusal reaches the user as the cluster said it, not as a traceback."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable

from tests.e2e.conftest import GPUPOOL, Server, wait_for
from tests.kubernetes.cluster import Cluster


def test_exec_attach_and_port_forward_reach_the_members_pod_and_say_why_the_cluster_refused(
    cluster: Cluster, kube_server: Callable[..., Server]
) -> None:
    (node,) = cluster.add_gpu_nodes(1, prefix="sh")
    s = kube_server()
    wait_for(lambda: any(n["name"] == node and n["schedulable"] for n in s.json("nodes")), 30, "the node")
    s.cli("project", "create", "lab", "--deserved-gpus", "8", "--pool", "h100")
    s.cli("submit", "-p", "lab", "--name", "job", "--gpus", "1", "--", "sleep", "inf")
    s.wait_state("job", "running")
    # kwok answers for the kubelet: the streams reach the member's own pod and container, where nothing is
    # configured to answer; the CLI says what the cluster said.
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
    forward = subprocess.Popen([GPUPOOL, "port-forward", "job", "0:8080"], env=s.env | {"GPUPOOL_URL": s.url,
                               "GPUPOOL_TOKEN": s.admin_token}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)  # fmt: skip
    try:
        assert forward.stdout is not None and forward.stderr is not None
        port = int(forward.stdout.readline().split(":")[1].split()[0])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
            conn.settimeout(30)
            assert conn.recv(100) == b""
        said = 'no forward found for port 8080 in pod "gpupool-lab/job-1-0-0"'
        assert forward.stderr.readline() == (
            f"port-forward: error forwarding port 8080 to pod job-1-0-0/gpupool-lab, uid : {said}\n"
        )
    finally:
        forward.kill()
        forward.wait(10)
    trail = [(a.object, a.action, a.status) for a in s.client().audit(limit=20) if "rank" in a.action]
    assert ("workload/job", "exec rank 0: true", 101) in trail
    s.cli("cancel", "job")
