"""Pods for decisions, and pod phases back as observations, through a real Kubernetes API server."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gpupool import __version__
from gpupool.backends.base import (
    AppEndpoint,
    Capabilities,
    FilesError,
    FilesTarget,
    LaunchSpec,
    LaunchWaits,
    Observed,
    Sample,
    VolumeSpec,
)
from gpupool.backends.kubernetes.adoption import ForeignPods
from gpupool.backends.kubernetes.dcgm import DcgmScraper, DcgmSettings, PodIndex, to_sample
from gpupool.backends.kubernetes.files import PodFiles
from gpupool.backends.kubernetes.logs import follow
from gpupool.backends.kubernetes.manifests import (
    MANAGED,
    MEMBER,
    SCHEDULER,
    SECRETS,
    SYSTEM_NAMESPACE,
    UID_BASE,
    WORKLOAD_ID,
    CodeFetch,
    check_level,
    code_secret,
    code_secret_manifest,
    gang_service_manifest,
    granted,
    namespace_for,
    node_from,
    pod_manifest,
    ready,
    reservation_manifest,
    secrets_manifest,
)
from gpupool.backends.kubernetes.namespaces import Namespaces, own_namespace
from gpupool.backends.kubernetes.podwatch import PodWatch
from gpupool.backends.kubernetes.volumes import claim_manifest, claim_name
from gpupool.core import Node

log = logging.getLogger("gpupool.kubernetes")
INVENTORY_TIMEOUT = (10, 30)
"""(connect, read) seconds for reading the nodes: a hub's heartbeat of a spoke ends, whatever its network does."""

SERVER_IMAGE = f"ghcr.io/gpupool/gpupool:{__version__}"
"""The server's own image, as deploy/kubernetes and the Helm chart name it: it has gpupool's client."""
NO_CODE_URL = (
    "the kubernetes backend needs the server's public URL (--public-url, GPUPOOL_PUBLIC_URL) as pods reach it: "
    "each pod's init step fetches its workload's code from there"
)


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
    watch_timeout_s: int = 60
    """How long one watch request runs before the API server ends it; the watch then resumes, with no list."""
    stale_after_s: float = 30.0
    """A pod watch failing this long makes the view stale: observe() then concludes nothing."""
    unseen_for_s: float = 120.0
    """How long a pod launch() created counts as alive before the watch has shown it."""
    sync_wait_s: float = 30.0
    """How long starting waits for the first list (observe() says "not synced" until it is done)."""
    dcgm: DcgmSettings | None = field(default_factory=DcgmSettings)
    """Where GPU telemetry comes from (NVIDIA's DCGM exporter); None: no telemetry."""
    code_url: str | None = None
    """The server's API as pods reach it: where a pod's init step fetches its workload's code."""
    code_image: str = SERVER_IMAGE
    """The image of that init step: any with gpupool's client (`python -m gpupool.client.code`)."""
    scheduler_name: str = SCHEDULER
    """The `spec.schedulerName` gpupool serves: pods it did not make that name it are scheduled by gpupool."""
    server_namespace: str | None = None
    """Where the server runs, whose pods (the app proxy) a project's pods take connections from; None: its own
    service account's namespace in the cluster, else gpupool-system (deploy/kubernetes's)."""


class KubernetesBackend:
    def __init__(
        self,
        settings: KubeSettings,
        on_change: Callable[[], None] = lambda: None,
        code_token: Callable[[int], str] | None = None,
    ) -> None:
        """`code_token(workload_id)`: a token that reads that workload's code and nothing else, which its pods'
        init step presents (the server mints it). Without it, a workload's code does not reach its pods."""
        if code_token is not None and not settings.code_url:
            raise ValueError(NO_CODE_URL)
        import kubernetes

        # The client's stubs want its model classes; it takes plain manifests just as well, which keeps the
        # manifests pure and testable. So it is used untyped, here only.
        k8s: Any = kubernetes
        client, config = k8s.client, k8s.config
        self.settings = settings
        self._code_token = code_token
        cfg = client.Configuration()
        if settings.kubeconfig:
            config.load_kube_config(config_file=settings.kubeconfig, client_configuration=cfg)
        else:
            config.load_incluster_config(client_configuration=cfg)
        cfg.connection_pool_maxsize = 16  # launches run in parallel
        api = client.ApiClient(cfg)
        self.core: Any = client.CoreV1Api(api)
        self._client = client
        self._to_dict: Callable[[Any], dict[str, Any]] = api.sanitize_for_serialization
        self._lock = threading.Lock()
        """Guards what inventory() learns of nodes; the pods have the watch's lock."""
        self._namespaces = Namespaces(self.core, client.NetworkingV1Api(api), client.ApiException,
                                      settings.server_namespace or own_namespace())  # fmt: skip
        self._not_ready_since: dict[str, float] = {}
        self._known_nodes: set[str] | None = None
        self._models: dict[str, str] = {}
        self._background = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gpupool-kube-delete")
        self.watch = PodWatch(
            self.core, on_change, timeout_s=settings.watch_timeout_s, stale_after_s=settings.stale_after_s,
            unseen_for_s=settings.unseen_for_s, scheduler=settings.scheduler_name,
            namespace_prefix=settings.namespace_prefix,
        )  # fmt: skip
        self.foreign = ForeignPods(self.core, client, self.watch, settings.scheduler_name)
        """The pods that name gpupool's scheduler without gpupool having made them (gpupool.control.foreign)."""
        self.watch.start(settings.sync_wait_s)
        self._dcgm = DcgmScraper(self.core, settings.dcgm) if settings.dcgm is not None else None

    # -- nodes ---------------------------------------------------------------------------------------------
    def inventory(self) -> list[Node]:
        now = time.monotonic()
        out = []
        seen = set()
        models: dict[str, str] = {}
        for item in self.core.list_node(_request_timeout=INVENTORY_TIMEOUT).items:
            obj = self._to_dict(item)
            name = obj["metadata"]["name"]
            seen.add(name)
            if ready(obj):
                self._not_ready_since.pop(name, None)
            else:
                self._not_ready_since.setdefault(name, now)
            node = node_from(obj, self.settings.pool_label, not_ready=not ready(obj))
            if node is not None and node.devices:
                models[name] = node.devices[0].model
                out.append(self.foreign.less_used(node))  # perhaps with no device left to offer
        with self._lock:
            self._models = models
            for gone in set(self._not_ready_since) - seen:
                del self._not_ready_since[gone]
            self._known_nodes = seen
        return sorted(out, key=lambda n: n.name)

    def capabilities(self) -> Capabilities:
        return Capabilities("kubernetes", fractions_enforced=False, notebooks=False, storage=self)

    # -- launch, stop, observe -----------------------------------------------------------------------------
    def launch(self, spec: LaunchSpec) -> None:
        foreign = self.foreign.claimed(spec.workload_id, spec.rank)
        if foreign is not None:
            self.foreign.bind(spec, foreign, self._reserve, self._unreserve)
            return
        if spec.adopted:  # its pods are not known yet (a server just started), or not made yet
            raise LaunchWaits(f"no pod is known for member {spec.rank} of workload {spec.workload_id} yet")
        ns = namespace_for(spec.project, self.settings.namespace_prefix)
        try:
            self._namespaces.ensure(ns, check_level(spec.pod_security))
            for d in spec.devices:
                if d.milli < 1000:
                    self._reserve(spec.node, d.index, spec.alloc_id)
            if spec.world_size > 1:
                self._create(lambda: self.core.create_namespaced_service(ns, gang_service_manifest(spec, ns)))
            if spec.secrets:
                self._put_secrets(ns, spec.secrets)
            for v in spec.volumes:  # before the pod, which waits for its claims to bind
                self._create(partial(self.core.create_namespaced_persistent_volume_claim, ns, claim_manifest(v, ns)))
            code = self._code_fetch(spec)
            if code is not None:
                # Before the pod: its init step reads the token from this Secret.
                secret = code_secret_manifest(spec, ns, code)
                self._create(lambda: self.core.create_namespaced_secret(ns, secret))
            body = pod_manifest(spec, ns, self.settings.default_image, self.settings.uid_base, code)
            self._create(lambda: self.core.create_namespaced_pod(ns, body))
        except Exception:
            # Retried next cycle, or never if the workload is stopped meanwhile (then nothing forgets it): its
            # devices must not stay reserved on its account.
            self._unreserve(spec.alloc_id)
            raise
        # Until the watch shows it, the pod is alive by our word: a cycle right now must not take it for gone.
        self.watch.launched(spec.alloc_id, body["metadata"]["name"], ns)

    def delete_volume(self, volume: VolumeSpec) -> None:
        """A deleted volume's claim goes (its data with it, as the StorageClass's reclaim policy says)."""
        ns = namespace_for(volume.project, self.settings.namespace_prefix)
        try:
            self.core.delete_namespaced_persistent_volume_claim(claim_name(volume), ns)
        except self._client.ApiException as e:
            if e.status != 404:  # never mounted: never made
                raise

    # -- files: a running pod's through its exec stream; nothing is kept after a pod ends -----------------
    def workload_files(self, target: FilesTarget) -> PodFiles:
        if target.alloc_id is None:
            why = "a pod's filesystem goes with it; write what must outlive it to a volume (--volume NAME:/path)"
            raise FilesError(f"{target.workload!r} (rank {target.rank}) has no running pod: {why}", 409)
        where = self._where(target.alloc_id)
        if where is None:
            raise FilesError(f"{target.workload!r} (rank {target.rank}) has no pod yet; try again", 409)
        return PodFiles(self.core, *where)

    def workdir_collected(self, workload_id: int) -> bool:
        return False

    def workdir_ids(self) -> list[int]:
        return []

    def collect_workdir(self, workload_id: int) -> None:
        """Nothing is kept after a pod ends, so nothing is collected."""

    def discard(self, workload_id: int) -> None:
        """Its pods went when it ended: nothing of a deleted workload's is left here."""

    def _code_fetch(self, spec: LaunchSpec) -> CodeFetch | None:
        if spec.code is None:
            return None
        if self._code_token is None or not self.settings.code_url:
            log.warning("workload %s has code but this backend cannot give it to pods (no code token source)",
                        spec.workload_id)  # fmt: skip
            return None
        token = self._code_token(spec.workload_id)
        return CodeFetch(self.settings.code_url.rstrip("/"), token, self.settings.code_image)

    def _put_secrets(self, ns: str, values: dict[str, str]) -> None:
        """The project's Secret as it is now (values set since its last launch included)."""
        body = secrets_manifest(values, ns)
        try:
            self.core.replace_namespaced_secret(SECRETS, ns, body)
        except self._client.ApiException as e:
            if e.status != 404:
                raise
            self._create(lambda: self.core.create_namespaced_secret(ns, body))

    def _where(self, alloc_id: str) -> tuple[str, str] | None:
        """The name and namespace of an allocation's pod, whether or not the watch has shown it yet."""
        with self.watch.lock:
            pod = self.watch.pods.get(alloc_id)
            unseen = self.watch.unseen.get(alloc_id)
        if pod is not None:
            return pod["metadata"]["name"], pod["metadata"]["namespace"]
        return (unseen.name, unseen.namespace) if unseen is not None else None

    def stop(self, alloc_id: str, force: bool) -> None:
        where = self._where(alloc_id)
        if where is None or (not force and self.foreign.suspends(alloc_id)):
            return  # an admitted Job's pod goes when the Job is suspended; deleted here once its grace is over
        with self.watch.lock:
            pod = self.watch.pods.get(alloc_id)
        if pod is not None and _labels(pod).get(MANAGED) != "true" and not pod["metadata"].get("deletionTimestamp"):
            self.foreign.disrupt(*where)  # once: a stop is asked again each cycle until the pod is gone
        grace = 0 if force else None
        try:
            self.core.delete_namespaced_pod(*where, grace_period_seconds=grace)
        except self._client.ApiException as e:
            if e.status != 404:
                raise

    def observe(self) -> dict[str, Observed] | None:
        now = time.monotonic()
        if not self.watch.fresh(now):
            return None  # not listed yet, or the watch has been failing too long: absence proves nothing
        with self.watch.lock:
            pods = dict(self.watch.pods)
            for alloc in [a for a, u in self.watch.unseen.items() if u.until <= now]:
                del self.watch.unseen[alloc]
            unseen = set(self.watch.unseen)
        with self._lock:
            known = self._known_nodes
            not_ready = dict(self._not_ready_since)
        out: dict[str, Observed] = {alloc: Observed(alloc, True) for alloc in unseen}
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
        where = self._where(alloc_id)
        with self.watch.lock:
            known = self.watch.pods.get(alloc_id)
        theirs = alloc_id in self.foreign.allocs if known is None else _labels(known).get(MANAGED) != "true"
        if theirs:
            where = None  # a pod gpupool did not make is its own controller's to delete once it has ended
        if where is not None:
            self._background.submit(self._delete, *where)
            with self.watch.lock:
                pod = self.watch.pods.get(alloc_id)
            if pod is None or pod["spec"].get("initContainers"):  # unseen pods may have one too
                self._background.submit(self._delete_code_secret, *where)
        with self.watch.lock:
            self.watch.forgotten.add(alloc_id)
            self.watch.unseen.pop(alloc_id, None)
        self._unreserve(alloc_id)

    def _unreserve(self, alloc_id: str) -> None:
        with self.watch.lock:
            for allocs in self.watch.launching.values():
                allocs.discard(alloc_id)
        self._release_unused()

    def _delete(self, name: str, namespace: str) -> None:
        try:
            self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        except self._client.ApiException as e:
            if e.status != 404:
                log.warning("deleting pod %s/%s failed: %s", namespace, name, e.reason)

    def _delete_code_secret(self, pod: str, namespace: str) -> None:
        try:
            self.core.delete_namespaced_secret(code_secret(pod), namespace)
        except self._client.ApiException as e:
            if e.status != 404:
                log.warning("deleting secret %s/%s failed: %s", namespace, code_secret(pod), e.reason)

    # -- logs ----------------------------------------------------------------------------------------------
    def _member_pod(self, workload_id: int, rank: int) -> tuple[str, str, str] | None:
        """(allocation, pod name, namespace) of the member's latest attempt."""
        with self.watch.lock:
            pods = [
                (int(labels.get("gpupool.io/attempt", "0")), alloc, p["metadata"])
                for alloc, p in self.watch.pods.items()
                if (labels := p["metadata"].get("labels") or {}).get(WORKLOAD_ID) == str(workload_id)
                and labels.get(MEMBER) == str(rank)
            ]  # fmt: skip
        if not pods:
            return None
        _, alloc, meta = max(pods, key=lambda p: (p[0], p[1]))
        return alloc, meta["name"], meta["namespace"]

    def read_log(self, workload_id: int, rank: int, offset: int, limit: int) -> bytes:
        member = self._member_pod(workload_id, rank)
        if member is None:
            return b""
        _, name, ns = member
        try:  # only as far as asked for: the kubelet stops there
            response = self.core.read_namespaced_pod_log(name, ns, limit_bytes=offset + limit, _preload_content=False)
        except self._client.ApiException:
            return b""
        return bytes(response.data)[offset : offset + limit]

    def follow_log(self, workload_id: int, rank: int, offset: int) -> Iterator[bytes]:
        """The member's output from byte `offset`, as it is written, until it ends; nothing while it has no
        pod or its container has not started (the caller then polls again)."""
        member = self._member_pod(workload_id, rank)
        if member is None:
            return iter(())
        alloc, name, ns = member

        def open_stream() -> Any:
            return self.core.read_namespaced_pod_log(name, ns, follow=True, _preload_content=False)

        def ended() -> bool:
            with self.watch.lock:
                pod = self.watch.pods.get(alloc)
            phase = ((pod or {}).get("status") or {}).get("phase")
            return pod is None or phase in ("Succeeded", "Failed") or bool(pod["metadata"].get("deletionTimestamp"))

        return follow(open_stream, offset, ended)

    # -- apps and telemetry --------------------------------------------------------------------------------
    def healthy(self, alloc_id: str, port: int | None) -> bool:
        with self.watch.lock:
            pod = self.watch.pods.get(alloc_id)
        return pod is not None and ready(pod)

    def app_endpoint(self, alloc_id: str, port: int | None) -> AppEndpoint | None:
        """The pod's own address: the server must reach the pod network (it runs in the cluster)."""
        with self.watch.lock:
            pod = self.watch.pods.get(alloc_id)
        ip = ((pod or {}).get("status") or {}).get("podIP")
        return AppEndpoint(host=str(ip), port=port) if ip and port is not None else None

    def sample(self) -> Sample:
        if self._dcgm is None:
            return Sample({}, (), modelled=False)
        readings = self._dcgm.readings()
        members: dict[tuple[str, str], str] = {}
        sharers: dict[tuple[str, int], dict[str, int]] = {}
        with self.watch.lock:
            for alloc, pod in self.watch.pods.items():
                if (pod.get("status") or {}).get("phase") != "Running":
                    continue
                meta = pod["metadata"]
                members[(meta["namespace"], meta["name"])] = alloc
                for index, milli in granted(pod):
                    if milli < 1000:
                        sharers.setdefault((pod["spec"].get("nodeName", ""), index), {})[alloc] = milli
            reservations = {name: key for key, name in self.watch.reservations.items()}
        with self._lock:
            models = dict(self._models)
        return to_sample(readings, PodIndex(members, reservations, sharers, models), SYSTEM_NAMESPACE)

    def close(self) -> None:
        self.watch.stop()
        if self._dcgm is not None:
            self._dcgm.close()
        self._background.shutdown(wait=False)

    # -- internals -----------------------------------------------------------------------------------------
    def _create(self, call: Callable[[], Any]) -> None:
        try:
            call()
        except self._client.ApiException as e:
            if e.status != 409:  # AlreadyExists: a retried launch, which is the point of deterministic names
                raise

    def _reserve(self, node: str, index: int, alloc_id: str) -> None:
        with self.watch.lock:
            self.watch.launching.setdefault((node, index), set()).add(alloc_id)
        self._namespaces.ensure(SYSTEM_NAMESPACE, "restricted")
        body = reservation_manifest(node, index, self.settings.default_image)
        self._create(lambda: self.core.create_namespaced_pod(SYSTEM_NAMESPACE, body))

    def _release_unused(self) -> None:
        """A reservation goes when the last sharer of its device has gone."""
        w = self.watch
        with w.lock:
            # Sharers being launched right now are not in the watch's view yet; their devices stay reserved.
            in_use = {key for key, allocs in w.launching.items() if allocs}
            for alloc, pod in w.pods.items():
                phase = (pod.get("status") or {}).get("phase")
                if pod["metadata"].get("deletionTimestamp") or alloc in w.forgotten or phase in ("Succeeded", "Failed"):
                    continue
                node = pod["spec"].get("nodeName", "")
                in_use.update((node, index) for index, milli in granted(pod) if milli < 1000)
            held = dict(w.reservations)
        for (node, index), name in held.items():
            if (node, index) not in in_use:
                self._delete(name, SYSTEM_NAMESPACE)


def _labels(pod: dict[str, Any]) -> dict[str, str]:
    return dict(pod["metadata"].get("labels") or {})


def _exit_code(pod: dict[str, Any], default: int) -> int | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        term = ((status.get("state") or {}).get("terminated")) or {}
        if "exitCode" in term:
            return int(term["exitCode"])
    return default

