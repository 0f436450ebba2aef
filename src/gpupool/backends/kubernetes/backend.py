"""Pods for decisions, and pod phases back as observations, through a real Kubernetes API server."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gpupool.backends.base import AppEndpoint, Capabilities, LaunchSpec, Observed, Sample
from gpupool.backends.kubernetes.manifests import (
    ALLOC,
    DEVICES,
    MANAGED,
    PSA_ENFORCE,
    RESERVATION,
    SECRETS,
    SYSTEM_NAMESPACE,
    UID_BASE,
    check_level,
    gang_service_manifest,
    namespace_for,
    namespace_manifest,
    node_from,
    pod_manifest,
    ready,
    reservation_manifest,
    secrets_manifest,
)
from gpupool.core import Node

log = logging.getLogger("gpupool.kubernetes")


@dataclass(frozen=True, slots=True)
class KubeSettings:
    kubeconfig: str | None = None
    """None: in-cluster configuration."""
    pool_label: str = "gpupool.io/pool"
    namespace_prefix: str = "gpupool-"
    default_image: str = "python:3.12-slim"
    node_lost_after_s: float = 300.0
    """A node NotReady this long (or deleted) sends its workloads back to the queue."""
    uid_base: int = UID_BASE
    """Project p's restricted pods run as uid = gid = uid_base + p."""


class KubernetesBackend:
    def __init__(self, settings: KubeSettings, on_change: Callable[[], None] = lambda: None) -> None:
        import kubernetes

        # The client's stubs want its model classes; it takes plain manifests just as well, which keeps the
        # manifests pure and testable. So it is used untyped, here only.
        k8s: Any = kubernetes
        client, config = k8s.client, k8s.config
        self.settings = settings
        cfg = client.Configuration()
        if settings.kubeconfig:
            config.load_kube_config(config_file=settings.kubeconfig, client_configuration=cfg)
        else:
            config.load_incluster_config(client_configuration=cfg)
        cfg.connection_pool_maxsize = 16  # launches run in parallel
        api = client.ApiClient(cfg)
        self.core: Any = client.CoreV1Api(api)
        self._client = client
        self._on_change = on_change
        self._lock = threading.Lock()
        self._pods: dict[str, dict[str, Any]] = {}
        """alloc id → pod (as a dict), kept by the watch."""
        self._reservations: dict[tuple[str, int], str] = {}
        self._launching: dict[tuple[str, int], set[str]] = {}
        """Devices whose sharer pods are being created, until the watch shows them."""
        self._forgotten: set[str] = set()
        self._namespaces: dict[str, str] = {}
        """Namespace → the Pod Security level its labels are known to enforce."""
        self._not_ready_since: dict[str, float] = {}
        self._nodes: dict[str, dict[str, Any]] = {}
        self._background = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gpupool-kube-delete")
        self._stopping = threading.Event()
        self._synced = threading.Event()
        self._thread = threading.Thread(target=self._watch_pods, name="gpupool-kube-watch", daemon=True)
        self._thread.start()
        self._synced.wait(30)

    # -- nodes ---------------------------------------------------------------------------------------------
    def inventory(self) -> list[Node]:
        now = time.monotonic()
        nodes = self.core.list_node().to_dict()["items"]
        out = []
        seen = set()
        for obj in nodes:
            obj = _camel(obj)
            name = obj["metadata"]["name"]
            seen.add(name)
            if ready(obj):
                self._not_ready_since.pop(name, None)
            else:
                self._not_ready_since.setdefault(name, now)
            node = node_from(obj, self.settings.pool_label, not_ready=not ready(obj))
            if node is not None and node.devices:
                out.append(node)
        with self._lock:
            self._nodes = {n.name: {} for n in out}
            for gone in set(self._not_ready_since) - seen:
                del self._not_ready_since[gone]
            self._known_nodes = seen
        return sorted(out, key=lambda n: n.name)

    def capabilities(self) -> Capabilities:
        return Capabilities("kubernetes", fractions_enforced=False, notebooks=False)

    # -- launch, stop, observe -----------------------------------------------------------------------------
    def launch(self, spec: LaunchSpec) -> None:
        ns = namespace_for(spec.project, self.settings.namespace_prefix)
        self._ensure_namespace(ns, check_level(spec.pod_security))
        for d in spec.devices:
            if d.milli < 1000:
                self._reserve(spec.node, d.index, spec.alloc_id)
        if spec.world_size > 1:
            self._create(lambda: self.core.create_namespaced_service(ns, gang_service_manifest(spec, ns)))
        if spec.secrets:
            self._put_secrets(ns, spec.secrets)
        body = pod_manifest(spec, ns, self.settings.default_image, self.settings.uid_base)
        self._create(lambda: self.core.create_namespaced_pod(ns, body))

    def _put_secrets(self, ns: str, values: dict[str, str]) -> None:
        """The project's Secret as it is now (values set since its last launch included)."""
        body = secrets_manifest(values, ns)
        try:
            self.core.replace_namespaced_secret(SECRETS, ns, body)
        except self._client.ApiException as e:
            if e.status != 404:
                raise
            self._create(lambda: self.core.create_namespaced_secret(ns, body))

    def stop(self, alloc_id: str, force: bool) -> None:
        with self._lock:
            pod = self._pods.get(alloc_id)
        if pod is None:
            return
        meta = pod["metadata"]
        grace = 0 if force else None
        try:
            self.core.delete_namespaced_pod(meta["name"], meta["namespace"], grace_period_seconds=grace)
        except self._client.ApiException as e:
            if e.status != 404:
                raise

    def observe(self) -> dict[str, Observed]:
        with self._lock:
            pods = dict(self._pods)
            known = getattr(self, "_known_nodes", None)
            not_ready = dict(self._not_ready_since)
        now = time.monotonic()
        out: dict[str, Observed] = {}
        for alloc, pod in pods.items():
            node = pod["spec"].get("nodeName", "")
            lost = (known is not None and node not in known) or (
                node in not_ready and now - not_ready[node] >= self.settings.node_lost_after_s
            )
            phase = (pod.get("status") or {}).get("phase", "Pending")
            if pod["metadata"].get("deletionTimestamp") and phase in ("Pending", "Running"):
                out[alloc] = Observed(alloc, True)
            elif lost:
                out[alloc] = Observed(alloc, False, None, lost=True)
            elif phase == "Succeeded":
                out[alloc] = Observed(alloc, False, _exit_code(pod, 0))
            elif phase == "Failed":
                out[alloc] = Observed(alloc, False, _exit_code(pod, 1))
            else:
                out[alloc] = Observed(alloc, True)
        return out

    def forget(self, alloc_id: str) -> None:
        """Delete an ended member's pod in the background: the loop need not wait on the API server for it."""
        with self._lock:
            pod = self._pods.get(alloc_id)
        if pod is not None:
            self._background.submit(self._delete, pod["metadata"]["name"], pod["metadata"]["namespace"])
        with self._lock:
            self._forgotten.add(alloc_id)
        self._release_unused()

    def _delete(self, name: str, namespace: str) -> None:
        try:
            self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        except self._client.ApiException as e:
            if e.status != 404:
                log.warning("deleting pod %s/%s failed: %s", namespace, name, e.reason)

    def read_log(self, workload_id: int, rank: int, offset: int, limit: int) -> bytes:
        with self._lock:
            pods = [
                p for p in self._pods.values()
                if p["metadata"]["labels"].get("gpupool.io/workload-id") == str(workload_id)
                and p["metadata"]["labels"].get("gpupool.io/member") == str(rank)
            ]  # fmt: skip
        if not pods:
            return b""
        meta = pods[-1]["metadata"]
        try:
            text = self.core.read_namespaced_pod_log(meta["name"], meta["namespace"])
        except self._client.ApiException:
            return b""
        return str(text).encode()[offset : offset + limit]

    def healthy(self, alloc_id: str, port: int | None) -> bool:
        with self._lock:
            pod = self._pods.get(alloc_id)
        return pod is not None and ready(pod)

    def app_endpoint(self, alloc_id: str, port: int | None) -> AppEndpoint | None:
        """The pod's own address: the server must reach the pod network (it runs in the cluster)."""
        with self._lock:
            pod = self._pods.get(alloc_id)
        ip = ((pod or {}).get("status") or {}).get("podIP")
        return AppEndpoint(host=str(ip), port=port) if ip and port is not None else None

    def sample(self) -> Sample:
        return Sample({}, (), modelled=False)

    def close(self) -> None:
        self._stopping.set()
        self._background.shutdown(wait=False)

    # -- internals -----------------------------------------------------------------------------------------
    def _create(self, call: Callable[[], Any]) -> None:
        try:
            call()
        except self._client.ApiException as e:
            if e.status != 409:  # AlreadyExists: a retried launch, which is the point of deterministic names
                raise

    def _ensure_namespace(self, ns: str, level: str) -> None:
        """Create it labelled for Pod Security Admission at `level`; one gpupool made earlier, perhaps at another
        level (an admin changed the project's), is relabelled. Namespaces gpupool did not make are left alone."""
        if self._namespaces.get(ns) == level:
            return
        body = namespace_manifest(ns, level)
        try:
            self.core.create_namespace(body)
        except self._client.ApiException as e:
            if e.status != 409:
                raise
            labels = self.core.read_namespace(ns).metadata.labels or {}
            if labels.get(MANAGED) == "true" and labels.get(PSA_ENFORCE) != level:
                try:
                    self.core.patch_namespace(ns, {"metadata": {"labels": body["metadata"]["labels"]}})
                except self._client.ApiException as e:
                    if e.status != 403:
                        raise
                    # The pods still carry their own securityContext; the label is the API server's check of it.
                    log.warning("cannot label namespace %s for pod security %s (gpupool needs patch on namespaces)",
                                ns, level)  # fmt: skip
        self._namespaces[ns] = level

    def _reserve(self, node: str, index: int, alloc_id: str) -> None:
        with self._lock:
            self._launching.setdefault((node, index), set()).add(alloc_id)
        self._ensure_namespace(SYSTEM_NAMESPACE, "restricted")
        body = reservation_manifest(node, index, self.settings.default_image)
        self._create(lambda: self.core.create_namespaced_pod(SYSTEM_NAMESPACE, body))

    def _release_unused(self) -> None:
        """A reservation goes when the last sharer of its device has gone."""
        with self._lock:
            # Sharers being launched right now are not in the watch's view yet; their devices stay reserved.
            in_use = {key for key, allocs in self._launching.items() if allocs}
            for alloc, pod in self._pods.items():
                phase = (pod.get("status") or {}).get("phase")
                if (
                    pod["metadata"].get("deletionTimestamp")
                    or alloc in self._forgotten
                    or phase in ("Succeeded", "Failed")
                ):
                    continue
                node = pod["spec"].get("nodeName", "")
                for part in filter(None, (pod["metadata"].get("annotations") or {}).get(DEVICES, "").split(",")):
                    index, milli = part.split(":")
                    if int(milli) < 1000:
                        in_use.add((node, int(index)))
            held = dict(self._reservations)
        for (node, index), name in held.items():
            if (node, index) not in in_use:
                self._delete(name, SYSTEM_NAMESPACE)

    def _apply_event(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        with self._lock:
            if labels.get(RESERVATION) == "true":
                key = (
                    (meta.get("annotations") or {}).get("gpupool.io/node-name", ""),
                    int(labels["gpupool.io/device"]),
                )
                if kind == "DELETED":
                    self._reservations.pop(key, None)
                else:
                    self._reservations[key] = meta["name"]
                return
            alloc = (meta.get("annotations") or {}).get(ALLOC)
            if not alloc:
                return
            if kind == "DELETED":
                self._pods.pop(alloc, None)
                self._forgotten.discard(alloc)
            else:
                self._pods[alloc] = pod
                for allocs in self._launching.values():
                    allocs.discard(alloc)

    def _watch_pods(self) -> None:
        """List, then watch from the list's resourceVersion; on 410 Gone (or any break) list again."""
        import kubernetes

        watch: Any = kubernetes.watch
        while not self._stopping.is_set():
            try:
                listing = self.core.list_pod_for_all_namespaces(label_selector=f"{MANAGED}=true")
                with self._lock:
                    self._pods.clear()
                    self._reservations.clear()
                for item in listing.items:
                    self._apply_event("ADDED", _camel(item.to_dict()))
                self._synced.set()
                self._on_change()
                rv = listing.metadata.resource_version
                w = watch.Watch()
                for event in w.stream(
                    self.core.list_pod_for_all_namespaces,
                    label_selector=f"{MANAGED}=true",
                    resource_version=rv,
                    timeout_seconds=60,
                ):
                    if self._stopping.is_set():
                        return
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        break  # usually 410 Gone: the version is too old; list again
                    self._apply_event(event["type"], _camel(obj.to_dict()))
                    self._on_change()
            except Exception:  # the API server restarted or the connection dropped: list again shortly
                log.warning("pod watch interrupted; listing again", exc_info=True)
                self._stopping.wait(1.0)


def _exit_code(pod: dict[str, Any], default: int) -> int | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        term = ((status.get("state") or {}).get("terminated")) or {}
        if "exitCode" in term:
            return int(term["exitCode"])
    return default


_SNAKE = {
    "node_name": "nodeName", "deletion_timestamp": "deletionTimestamp", "container_statuses": "containerStatuses",
    "exit_code": "exitCode", "resource_version": "resourceVersion",
}  # fmt: skip


def _camel(obj: Any) -> Any:
    """The client's to_dict() speaks snake_case; the manifests module reads the API's own camelCase keys."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            key = _SNAKE.get(k) or (k if "_" not in k or k.startswith("_") else _to_camel(k))
            if k in ("labels", "annotations", "allocatable", "capacity", "limits", "requests"):
                out[key] = v
            else:
                out[key] = _camel(v)
        return out
    if isinstance(obj, list):
        return [_camel(v) for v in obj]
    return obj


def _to_camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)
