"""`gpupool cp` on the Kubernetes backend, against a real kube-apiserver. A running member's files are reached
through the API server's exec stream of its pod (tar, as `kubectl cp` does); no kubelet runs here (kwok plays the
nodes and answers exec with an error), so what is proven is that cp reaches the member's own pod and container and
that the cluster's refusal reaches the user as it said it, never as a traceback. An ended pod's files went with it:
409, saying so. Copying real bytes needs a real kubelet (docs/data.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.e2e.conftest import Server, wait_for
from tests.kubernetes.cluster import Cluster


def test_cp_reaches_the_running_pod_through_exec_and_an_ended_pod_has_no_files(
    cluster: Cluster, kube_server: Callable[..., Server], tmp_path: Path
) -> None:
    (node,) = cluster.add_gpu_nodes(1, prefix="cp")
    s = kube_server()
    wait_for(lambda: any(n["name"] == node and n["schedulable"] for n in s.json("nodes")), 30, "the node")
    s.cli("project", "create", "lab", "--deserved-gpus", "8", "--pool", "h100")
    s.cli("submit", "-p", "lab", "--name", "job", "--gpus", "1", "--", "sleep", "inf")
    s.wait_state("job", "running")
    said = 'error executing command in container: no exec found for container "main" in pod "gpupool-lab/job-1-0-0"'
    refused = f"error: cp in pod job-1-0-0 failed: Internal error occurred: Internal error occurred: {said}\n"
    out = s.cli("cp", "job:out", str(tmp_path / "got"), check=False)
    assert (out.returncode, out.stdout, out.stderr) == (1, "", refused)
    (tmp_path / "note.txt").write_text("in\n")
    put = s.cli("cp", str(tmp_path / "note.txt"), "job:note.txt", check=False)
    assert (put.returncode, put.stdout, put.stderr) == (1, "", refused)
    listed = s.client()._call("GET", "/api/v1/workloads/job/files", params={"list": "1"}, accept=(409,))
    assert listed.json()["detail"] == refused.removeprefix("error: ").rstrip("\n")

    s.cli("cancel", "job")
    s.wait_state("job", "cancelled")
    ended = s.cli("cp", "job:out", str(tmp_path / "got"), check=False)
    why = "a pod's filesystem goes with it; write what must outlive it to a volume (--volume NAME:/path)"
    assert (ended.returncode, ended.stderr) == (1, f"error: 'job' (rank 0) has no running pod: {why}\n")
    assert not (tmp_path / "got").exists()
