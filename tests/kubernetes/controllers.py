"""The Kubernetes ecosystem's own controllers on the tests' cluster: kube-controller-manager (only the controllers a
batch/v1 Job needs) and JobSet's controller manager with its CRD and webhooks, both built by scripts/build-k8s.

kube-controller-manager runs the Job controller, which creates and replaces a Job's pods, and the garbage
collector, which deletes a Job's pods with it. The API server's ServiceAccount admission plugin is off in these
tests, so a Job's pods need no service account or token and the token controllers (and their keys) are not run.

JobSet's webhooks are served for real (the controller relies on its defaulting webhook): the fixture writes a
self-signed certificate for 127.0.0.1 and registers the release's webhook configurations with a URL there."""

from __future__ import annotations

import base64
import subprocess
import time
from collections.abc import Callable
from typing import Any

import httpx
import yaml
from kubernetes.client.exceptions import ApiException

from kubernetes import client
from tests.kubernetes.cluster import Cluster, free_port

JOBSET_GROUP, JOBSET_VERSION, JOBSETS = "jobset.x-k8s.io", "v1alpha2", "jobsets"
KUBE_CONTROLLERS = ("job-controller", "garbage-collector-controller")
# The release's kustomize patch: its pod webhooks only see pods of a JobSet.
JOBSET_POD_SELECTOR = {"matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}


def poll(what: str, check: Callable[[], bool], timeout: float = 60, logs: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}\n{logs()}")


def _answers(url: str) -> bool:
    """The health endpoint says 200 (its certificate is the component's own self-signed one: not checked)."""
    try:
        return httpx.get(url, verify=False, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


class _Process:
    """One controller process of the cluster's: started, checked for an early exit, killed."""

    name = ""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.proc: subprocess.Popen[bytes] | None = None

    def _run(self, args: list[str], ready: str, check: Callable[[], bool]) -> None:
        """Start the process and wait for `check` (`ready` names it in a timeout's message)."""
        self.proc = self.cluster.spawn(self.name, args)
        poll(f"{self.name}: {ready}", lambda: self._alive() and check(), logs=self.cluster.logs)

    def _alive(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited: {self.cluster.logs()}")
        return True

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(20)


class ControllerManager(_Process):
    """kube-controller-manager with only `controllers`, as the cluster's admin, leader election off."""

    name = "kube-controller-manager"

    def __init__(self, cluster: Cluster, controllers: tuple[str, ...] = KUBE_CONTROLLERS) -> None:
        super().__init__(cluster)
        self.controllers = controllers
        self.port = free_port()

    def start(self) -> ControllerManager:
        c = self.cluster
        self._run(
            [
                str(c.bin / "kube-controller-manager"),
                f"--kubeconfig={c.kubeconfig}",
                f"--controllers={','.join(self.controllers)}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--cert-dir={c.root / 'kcm-certs'}",
                # A burst of Jobs' pods is not throttled below what the API server itself takes (default 20/s).
                "--kube-api-qps=500",
                "--kube-api-burst=1000",
            ],
            "/healthz",
            lambda: _answers(f"https://127.0.0.1:{self.port}/healthz"),
        )
        return self


class JobSetManager(_Process):
    """JobSet's controller manager: CRD applied, webhooks served on 127.0.0.1 with a certificate the API server
    trusts, metrics off, leader election off."""

    name = "jobset"

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(cluster)
        self.webhook_port = free_port()
        self.probe_port = free_port()

    def start(self) -> JobSetManager:
        c, d = self.cluster, self.cluster.root / "jobset"
        (d / "certs").mkdir(parents=True)
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=jobset-webhook",
             "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(d / "certs" / "tls.key"),
             "-out", str(d / "certs" / "tls.crt")],
            check=True, capture_output=True,
        )  # fmt: skip
        config = {
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"host": "127.0.0.1", "port": self.webhook_port, "certDir": str(d / "certs")},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.probe_port}"},
        }
        (d / "config.yaml").write_text(yaml.safe_dump(config))
        api = c.api()
        crd = yaml.safe_load((c.bin / "jobset-crd.yaml").read_text())
        client.ApiextensionsV1Api(api).create_custom_resource_definition(crd)
        # /readyz answers once the webhook server listens with its certificate.
        self._run(
            [str(c.bin / "jobset"), f"--kubeconfig={c.kubeconfig}", f"--config={d / 'config.yaml'}"],
            "/readyz",
            lambda: _answers(f"http://127.0.0.1:{self.probe_port}/readyz"),
        )
        self._register_webhooks(api, (d / "certs" / "tls.crt").read_bytes())
        poll("the JobSet webhooks", lambda: self._alive() and self._admits(api), logs=c.logs)
        return self

    def _register_webhooks(self, api: Any, cert: bytes) -> None:
        admission = client.AdmissionregistrationV1Api(api)
        ca = base64.b64encode(cert).decode()
        for doc in yaml.safe_load_all((self.cluster.bin / "jobset-webhooks.yaml").read_text()):
            for hook in doc["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{self.webhook_port}{path}", "caBundle": ca}
                if hook["rules"][0]["resources"] == ["pods"]:
                    hook["objectSelector"] = JOBSET_POD_SELECTOR
            doc["metadata"]["name"] = f"jobset-{doc['metadata']['name']}"
            if doc["kind"] == "MutatingWebhookConfiguration":
                admission.create_mutating_webhook_configuration(doc)
            else:
                admission.create_validating_webhook_configuration(doc)

    def _admits(self, api: Any) -> bool:
        """A JobSet passes the webhooks in a server-side dry run (also: the CRD is established)."""
        try:
            client.CustomObjectsApi(api).create_namespaced_custom_object(
                JOBSET_GROUP, JOBSET_VERSION, "default", JOBSETS, jobset("ready-probe", {"a": 1}), dry_run="All"
            )
            return True
        except ApiException:
            return False


class Workloads:
    """Jobs, JobSets and their pods in one namespace, as a test drives them; clear() leaves none behind."""

    def __init__(self, cluster: Cluster, namespace: str = "default") -> None:
        self.cluster = cluster
        self.namespace = namespace
        api = cluster.api()
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def create_job(self, body: dict[str, Any]) -> None:
        self.batch.create_namespaced_job(self.namespace, body)

    def create_jobset(self, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, self.namespace, JOBSETS, body)

    def set_suspend(self, job: str, suspend: bool) -> None:
        self.batch.patch_namespaced_job(job, self.namespace, {"spec": {"suspend": suspend}})

    def pods(self, selector: str) -> list[Any]:
        """The selected pods not being deleted, by name."""
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
        return sorted((p for p in pods if p.metadata.deletion_timestamp is None), key=lambda p: p.metadata.name)

    def wait_pods(self, selector: str, count: int, phase: str = "Pending", timeout: float = 60) -> list[Any]:
        """Wait until exactly `count` live pods match `selector`, all in `phase`; returns them."""
        found: list[Any] = []

        def ready() -> bool:
            found[:] = self.pods(selector)
            return len(found) == count and all(p.status.phase == phase for p in found)

        poll(f"{count} pods {selector} {phase}", ready, timeout, self.cluster.logs)
        return found

    def bind(self, pod: str, node: str) -> None:
        """Bind as a scheduler does, through the Binding subresource."""
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod},
            "target": {"kind": "Node", "name": node},
        }
        # The generated client cannot read the Status this answers with: the response is not deserialised.
        self.core.create_namespaced_pod_binding(pod, self.namespace, body, _preload_content=False)

    def job_condition(self, job: str, kind: str) -> bool:
        status = self.batch.read_namespaced_job_status(job, self.namespace).status
        return any(c.type == kind and c.status == "True" for c in status.conditions or [])

    def clear(self) -> None:
        """Delete every JobSet, Job and pod in the namespace and wait until no pod is left."""
        crd = (JOBSET_GROUP, JOBSET_VERSION, self.namespace, JOBSETS)
        try:
            for js in self.custom.list_namespaced_custom_object(*crd)["items"]:
                self.custom.delete_namespaced_custom_object(
                    *crd, js["metadata"]["name"], propagation_policy="Background"
                )
        except ApiException as e:
            if e.status != 404:  # no JobSet CRD in this cluster
                raise
        for job in self.batch.list_namespaced_job(self.namespace).items:
            try:
                self.batch.delete_namespaced_job(job.metadata.name, self.namespace, propagation_policy="Background")
            except ApiException as e:
                if e.status != 404:  # a JobSet's, deleted with it meanwhile
                    raise
        self.core.delete_collection_namespaced_pod(self.namespace, grace_period_seconds=0)
        # A Job's pods keep its tracking finalizer until the Job controller has counted them.
        poll("the namespace's pods gone", lambda: not self.core.list_namespaced_pod(self.namespace).items,
             logs=self.cluster.logs)  # fmt: skip


def pod_template(scheduler: str, labels: dict[str, str] | None = None, run_for: str = "") -> dict[str, Any]:
    """A pod for kwok (which plays the kubelet): one container asking one GPU, never restarted in place. With
    `run_for` (a duration such as "2s") kwok ends it Succeeded that long after it runs; else it runs on."""
    container: dict[str, Any] = {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    if run_for:
        container["env"] = [{"name": "RUN_FOR", "value": run_for}]
    return {
        "metadata": {"labels": dict(labels or {})},
        "spec": {"schedulerName": scheduler, "restartPolicy": "Never", "containers": [container]},
    }


def indexed_job(
    name: str, pods: int, scheduler: str = "default-scheduler", suspend: bool = False, run_for: str = ""
) -> dict[str, Any]:
    """A batch/v1 Indexed Job of `pods` pods all running at once."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": pods,
            "parallelism": pods,
            "backoffLimit": 6,
            "suspend": suspend,
            "template": pod_template(scheduler, run_for=run_for),
        },
    }


def jobset(name: str, replicated: dict[str, int], scheduler: str = "default-scheduler") -> dict[str, Any]:
    """A JobSet of one replica per entry of `replicated`, each an Indexed Job of that many pods."""
    return {
        "apiVersion": f"{JOBSET_GROUP}/{JOBSET_VERSION}",
        "kind": "JobSet",
        "metadata": {"name": name},
        "spec": {
            "replicatedJobs": [
                {
                    "name": job,
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "completionMode": "Indexed",
                            "completions": pods,
                            "parallelism": pods,
                            "backoffLimit": 0,
                            "template": pod_template(scheduler),
                        }
                    },
                }
                for job, pods in replicated.items()
            ]
        },
    }
