"""A workload's code reaches its pod through an init step that fetches it from the server over HTTP (no shared
filesystem), with a token kept in a Secret of the pod's own. kwok runs no containers, so the test runs the init
container's command itself, with the argv and environment the stored pod spec gives it, against a real server."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.backends.base import DeviceGrant, LaunchSpec
from gpupool.backends.kubernetes.backend import NO_CODE_URL, SERVER_IMAGE, KubernetesBackend, KubeSettings
from gpupool.client.code import upload
from gpupool.models.accounts import UserCreate
from gpupool.models.schemas import WorkloadCreate
from gpupool.services import code as code_service
from gpupool.store.engine import make_engine, session_factory
from gpupool.store.tables import QueueRow, WorkloadRow
from kubernetes import client
from tests.e2e.conftest import Server, Servers, wait_for
from tests.kubernetes.cluster import REPO, Cluster

INIT_IMAGE = "registry.example/gpupool:test"


def _sessions(server: Server) -> Callable[[], Session]:
    return session_factory(make_engine(f"sqlite:///{server.data_dir / 'gpupool.db'}"))


def token_source(server: Server) -> Callable[[int], str]:
    """What the server's entry point gives the backend: tokens minted from the server's own store."""
    sessions = _sessions(server)

    def code_token(workload_id: int) -> str:
        with sessions() as s:
            row = s.get(WorkloadRow, workload_id)
            assert row is not None
            return code_service.mint_token(s, row)

    return code_token


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    servers = Servers(tmp_path)
    yield servers.start(None, "fake:1xH100-80GB", ())
    servers.close()


def _tree(root: Path, train: str) -> Path:
    (root / "data").mkdir(parents=True)
    (root / "train.py").write_text(train)
    (root / "data" / "rows.csv").write_text("a,b\n1,2\n")
    (root / "run.sh").write_text("#!/bin/sh\npython train.py\n")
    (root / "run.sh").chmod(0o755)
    return root


def _files(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mode & 0o777) for p in root.rglob("*") if p.is_file()
    }


H100 = DeviceGrant(0, 1000, 81559, "H100-80GB-HBM3", 81559)


def _spec(workload: Any, code: str, node: str, project_id: int) -> LaunchSpec:
    return LaunchSpec(
        alloc_id=f"{workload.id}-0-0", workload_id=workload.id, workload_name=workload.name, project="vision",
        kind="batch", argv=("python", "train.py"), env={}, devices=(H100,), node=node,
        image="registry.example/train:1", code=code, project_id=project_id,
    )  # fmt: skip


def _stored(cluster: Cluster, obj: Any) -> dict[str, Any]:
    return dict(cluster.api().sanitize_for_serialization(obj))


def _run_init_step(core: Any, pod: dict[str, Any], into: Path, **override: str) -> subprocess.CompletedProcess[str]:
    """The init container's command as the kubelet would run it: its argv (the emptyDir's mount point is `into`
    here), its environment with each secretKeyRef read from the API server, `python` this test's own."""
    (init,) = pod["spec"]["initContainers"]
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for var in init["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            secret = core.read_namespaced_secret(ref["name"], pod["metadata"]["namespace"])
            env[var["name"]] = base64.b64decode(secret.data[ref["key"]]).decode()
    env.update(override)
    (mount,) = init["volumeMounts"]
    argv = [str(into) if arg == mount["mountPath"] else arg for arg in init["command"]]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def test_a_pod_fetches_exactly_its_workloads_code_from_the_server_with_a_token_from_a_secret(
    cluster: Cluster, server: Server, tmp_path: Path
) -> None:
    (node,) = cluster.add_gpu_nodes(1, prefix="code")
    server.cli("project", "create", "vision", "--deserved-gpus", "1")
    ana = server.client(server.client().create_user(UserCreate(name="ana", projects=["vision"])).token)
    with _sessions(server)() as s:
        project_id = s.scalars(select(QueueRow.id).where(QueueRow.name == "vision")).one()
    one_src = _tree(tmp_path / "one", "print('one')\n")
    two_src = _tree(tmp_path / "two", "print('two')\n")
    codes = {name: upload(ana, src, "vision") for name, src in (("one", one_src), ("two", two_src))}
    one, two = (
        ana.submit(WorkloadCreate(project="vision", name=n, command=["true"], code=c)) for n, c in codes.items()
    )
    settings = KubeSettings(kubeconfig=str(cluster.kubeconfig), dcgm=None, code_url=server.url, code_image=INIT_IMAGE)
    backend = KubernetesBackend(settings, code_token=token_source(server))
    core = client.CoreV1Api(cluster.api())
    try:
        backend.launch(_spec(one, codes["one"], node, project_id))
        backend.launch(_spec(two, codes["two"], node, project_id))
        pods = wait_for(
            lambda: (p := core.list_namespaced_pod("gpupool-vision").items) and len(p) == 2 and p, 30, "both pods"
        )
        stored = {p["metadata"]["labels"]["gpupool.io/workload"]: p for p in (_stored(cluster, p) for p in pods)}
        pod = stored["one"]
        spec = pod["spec"]
        main = spec["containers"][0]
        assert spec["volumes"] == [{"name": "code", "emptyDir": {}}]
        assert (main["image"], main["workingDir"], main["volumeMounts"]) == (
            "registry.example/train:1", "/workspace", [{"name": "code", "mountPath": "/workspace"}],
        )  # fmt: skip
        secret_name = f"{pod['metadata']['name']}-code"
        token_ref = {"secretKeyRef": {"name": secret_name, "key": "token"}}
        assert spec["initContainers"] == [
            {
                "name": "code",
                "image": INIT_IMAGE,
                "command": ["python", "-m", "gpupool.client.code", "--into", "/workspace"],
                "env": [
                    {"name": "GPUPOOL_CODE_TOKEN", "valueFrom": token_ref},
                    {"name": "GPUPOOL_URL", "value": server.url},
                    {"name": "GPUPOOL_WORKLOAD_ID", "value": str(one.id)},
                ],
                "volumeMounts": [{"name": "code", "mountPath": "/workspace"}],
                "securityContext": main["securityContext"],
                "imagePullPolicy": "IfNotPresent",
                "resources": {},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
            }
        ]
        # The Pod Security admission took it at `restricted`, init step included; kwok then ran it.
        wait_for(lambda: core.read_namespaced_pod(pod["metadata"]["name"], "gpupool-vision").status.phase == "Running",
                 30, "the pod to run")  # fmt: skip
        token = token_source(server)(one.id)
        assert token not in str(stored)
        secret = core.read_namespaced_secret(secret_name, "gpupool-vision")
        assert (secret.data, secret.metadata.labels) == (
            {"token": base64.b64encode(token.encode()).decode()},
            {"gpupool.io/managed": "true", "gpupool.io/workload-id": str(one.id)},
        )

        done = _run_init_step(core, pod, tmp_path / "fetched-one")
        assert (done.returncode, done.stdout) == (0, f"gpupool: 3 files of workload {one.id}'s code in "
                                                     f"{tmp_path / 'fetched-one'}\n")  # fmt: skip
        assert _files(tmp_path / "fetched-one") == _files(one_src)
        done = _run_init_step(core, stored["two"], tmp_path / "fetched-two")
        assert (done.returncode, _files(tmp_path / "fetched-two")) == (0, _files(two_src))
        # Two's token, asking for one's code: not found, and nothing written.
        done = _run_init_step(core, stored["two"], tmp_path / "stolen", GPUPOOL_WORKLOAD_ID=str(one.id))
        assert (done.returncode, done.stderr, (tmp_path / "stolen").exists()) == (
            1, f"gpupool: cannot fetch the code of workload {one.id}: no workload named '{one.id}'\n", False,
        )  # fmt: skip

        backend.forget(f"{one.id}-0-0")
        wait_for(lambda: secret_name not in _secrets(core), 30, "the code secret to go with its pod")
        assert f"{stored['two']['metadata']['name']}-code" in _secrets(core)
    finally:
        backend.close()
        cluster.reset()


def _secrets(core: Any, namespace: str = "gpupool-vision") -> list[str]:
    return [s.metadata.name for s in core.list_namespaced_secret(namespace).items]


def test_a_pod_without_code_or_image_has_no_init_step_and_the_default_image(
    cluster: Cluster, backend: KubernetesBackend
) -> None:
    spec = LaunchSpec("9-0-0", 9, "bare", "plain", "batch", ("sleep", "inf"), {}, node="nowhere", project_id=2)
    backend.launch(spec)
    core = client.CoreV1Api(cluster.api())
    (pod,) = wait_for(lambda: core.list_namespaced_pod("gpupool-plain").items, 30, "the pod")
    stored = _stored(cluster, pod)["spec"]
    assert ("initContainers" in stored, "volumes" in stored, "workingDir" in stored["containers"][0]) == (
        False, False, False,
    )  # fmt: skip
    assert _secrets(core, "gpupool-plain") == []
    assert stored["containers"][0]["image"] == "python:3.12-slim"  # no image of its own: the server's --image


def test_a_backend_minting_code_tokens_refuses_to_start_without_the_servers_url(cluster: Cluster) -> None:
    with pytest.raises(ValueError) as refused:
        KubernetesBackend(KubeSettings(kubeconfig=str(cluster.kubeconfig), dcgm=None), code_token=lambda w: "gpc_")
    assert str(refused.value) == NO_CODE_URL


def test_the_init_image_defaults_to_the_servers_own_as_deployed() -> None:
    docs = [d for d in yaml.safe_load_all((REPO / "deploy" / "kubernetes" / "gpupool.yaml").read_text()) if d]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert KubeSettings().code_image == SERVER_IMAGE == container["image"]
