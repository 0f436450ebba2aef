"""A real Kubernetes control plane on 127.0.0.1 for the tests: etcd, kube-apiserver and kwok (playing every
kubelet), built from the Go module proxy by scripts/build-k8s. No kube-scheduler: gpupool binds pods itself.

kwok serves the kubelet API (pod logs) on this machine's own address, not loopback: the API server refuses to
proxy to loopback. Pods in LOG_NAMESPACE all print the one file `container_log` (CRI log format), followed."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
STAGES = Path(__file__).with_name("kwok-stages.yaml")
LOG_NAMESPACE = "gpupool-logs"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_port = free_port  # the name tests/kubernetes/gate.py imports


def host_ip() -> str:
    """This machine's address on its first route off loopback (no packet is sent; 127.0.0.1 where none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def binaries() -> Path:
    done = subprocess.run([str(REPO / "scripts" / "build-k8s")], capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/build-k8s failed: {done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


class Cluster:
    def __init__(self, root: Path, bin_dir: Path, apiserver_args: Sequence[str] = ()) -> None:
        self.root = root
        self.bin = bin_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.port = free_port()
        self.etcd_port = free_port()
        self.kubeconfig = root / "kubeconfig"
        self.token = "gpupool-test-token"
        self.apiserver_args = tuple(apiserver_args)
        self.host = host_ip()
        """Where kwok's kubelet API listens, and an address the API server will proxy to."""
        self.container_log = root / "container.log"

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        """Start a process of the cluster's (logged to `name`.log, in logs()); stop() kills it with the rest."""
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - kept for the process's life
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def start(self) -> Cluster:
        r = self.root
        etcd_port, peer_port = self.etcd_port, free_port()
        self.spawn(
            "etcd",
            [
                str(self.bin / "etcd"),
                "--data-dir",
                str(r / "etcd"),
                "--name",
                "test",
                "--listen-client-urls",
                f"http://127.0.0.1:{etcd_port}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{etcd_port}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-cluster",
                f"test=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",
            ],
        )
        subprocess.run(["openssl", "genrsa", "-out", str(r / "sa.key"), "2048"], check=True, capture_output=True)
        subprocess.run(
            ["openssl", "rsa", "-in", str(r / "sa.key"), "-pubout", "-out", str(r / "sa.pub")],
            check=True,
            capture_output=True,
        )
        (r / "tokens.csv").write_text(f"{self.token},admin,admin,system:masters\n")
        self.apiserver_argv = [
            str(self.bin / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            f"--secure-port={self.port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--cert-dir={r / 'certs'}",
            f"--token-auth-file={r / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={r / 'sa.pub'}",
            f"--service-account-signing-key-file={r / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/16",
            "--disable-admission-plugins=ServiceAccount",
            "--enable-priority-and-fairness=false",
            *self.apiserver_args,
        ]
        self.apiserver = self.spawn("kube-apiserver", self.apiserver_argv)
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "test",
                    "clusters": [
                        {
                            "name": "test",
                            "cluster": {"server": f"https://127.0.0.1:{self.port}", "insecure-skip-tls-verify": True},
                        }
                    ],
                    "users": [{"name": "admin", "user": {"token": self.token}}],
                    "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
                }
            )
        )
        self._wait_ready()
        kubelet_port = free_port()
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=kwok",
             "-addext", f"subjectAltName=IP:{self.host}", "-keyout", str(r / "kwok.key"), "-out", str(r / "kwok.crt")],
            check=True, capture_output=True,
        )  # fmt: skip
        self.container_log.touch()
        logs = {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "ClusterLogs",
            "metadata": {"name": "container-log"},
            "spec": {
                "selector": {"matchNamespaces": [LOG_NAMESPACE]},
                "logs": [{"logsFile": str(self.container_log), "follow": True}],
            },
        }
        (r / "kwok.yaml").write_text(STAGES.read_text() + "\n---\n" + yaml.safe_dump(logs))
        self.spawn(
            "kwok",
            [
                str(self.bin / "kwok"),
                f"--kubeconfig={self.kubeconfig}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                f"--config={r / 'kwok.yaml'}",
                f"--node-ip={self.host}",
                f"--node-port={kubelet_port}",
                f"--server-address={self.host}:{kubelet_port}",
                f"--tls-cert-file={r / 'kwok.crt'}",
                f"--tls-private-key-file={r / 'kwok.key'}",
            ],
        )
        return self

    def stop_api(self) -> None:
        """The API server goes away (etcd and kwok stay): to whoever uses the cluster, it is unreachable."""
        self.apiserver.kill()
        self.apiserver.wait(20)
        self.procs.remove(self.apiserver)

    def start_api(self) -> None:
        """The API server comes back on the same port, with what etcd kept."""
        self.apiserver = self.spawn("kube-apiserver", self.apiserver_argv)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 120) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited: {self.logs()}")
            try:
                r = httpx.get(
                    f"https://127.0.0.1:{self.port}/readyz",
                    verify=False,
                    timeout=2,
                    headers={"Authorization": f"Bearer {self.token}"},
                )
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"kube-apiserver not ready: {self.logs()}")

    def logs(self) -> str:
        return "\n".join(
            f"== {f.name}\n{f.read_text(errors='replace')[-2000:]}" for f in sorted(self.root.glob("*.log"))
        )

    def api(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def add_gpu_nodes(self, count: int, prefix: str = "gpu", gpus: int = 8, pool: str = "h100") -> list[str]:
        from kubernetes import client

        core = client.CoreV1Api(self.api())
        names = []
        for i in range(count):
            name = f"{prefix}-{i:03d}"
            body = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {"kwok.x-k8s.io/node": "fake"},
                    "labels": {
                        "type": "kwok",
                        "gpupool.io/pool": pool,
                        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                        "nvidia.com/gpu.memory": "81559",
                        "kubernetes.io/hostname": name,
                    },
                },
                "spec": {},
                "status": {
                    "allocatable": {"cpu": "96", "memory": "1Ti", "pods": "256", "nvidia.com/gpu": str(gpus)},
                    "capacity": {"cpu": "96", "memory": "1Ti", "pods": "256", "nvidia.com/gpu": str(gpus)},
                },
            }
            core.create_node(body)
            names.append(name)
        return names

    def reset(self) -> None:
        """Remove every node and gpupool pod, so the next test starts from an empty cluster."""
        from kubernetes import client

        core = client.CoreV1Api(self.api())
        for node in core.list_node().items:
            core.delete_node(node.metadata.name)
        for pod in core.list_pod_for_all_namespaces(label_selector="gpupool.io/managed=true").items:
            core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)

    def stop(self) -> None:
        # The cluster's state is deleted right after, so nothing is gained by a graceful stop: a terminated
        # kube-apiserver drains its watches for about 20 s, which cost every test module that much.
        for p in reversed(self.procs):
            p.kill()
        for p in self.procs:
            p.wait(20)


os.environ.setdefault("PYTHONWARNINGS", "ignore:Unverified HTTPS request")
