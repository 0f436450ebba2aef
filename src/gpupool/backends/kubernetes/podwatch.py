"""gpupool's view of the cluster's pods: listed once, then kept current by a watch that resumes where it left off.

It holds gpupool's own pods (by allocation), the device reservations, the pods that name gpupool as their scheduler
without gpupool having made them (each may become a workload: gpupool.control.foreign), and what the pods other
schedulers placed hold on each node (capacity in use there). Every pod is watched, as a scheduler must: a pod
another scheduler places on a GPU node takes room gpupool would otherwise give.

The list is the expensive part (every pod in the cluster), so it happens once, and again only when the
API server says the view's resourceVersion is too old to resume from (410 Gone). A watch that ends normally
(the server's timeout) is resumed from the last resourceVersion it saw, kept fresh by bookmarks. A new list
is built apart and swapped in whole: a reader never sees a half-filled view.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpupool.backends.kubernetes.foreign import ForeignPod, NodeUse, foreign_pod, node_use
from gpupool.backends.kubernetes.manifests import ALLOC, MANAGED, RESERVATION, SCHEDULER, SYSTEM_NAMESPACE, quantity

log = logging.getLogger("gpupool.kubernetes")
GONE = 410


@dataclass(frozen=True, slots=True)
class Unseen:
    """A pod launch() created that the watch has not shown yet."""

    name: str
    namespace: str
    until: float
    """Monotonic time after which it is no longer presumed alive (it was deleted before the watch saw it)."""


def reservation_key(pod: dict[str, Any]) -> tuple[str, int] | None:
    meta = pod["metadata"]
    labels = meta.get("labels") or {}
    if labels.get(RESERVATION) != "true" or meta.get("namespace") != SYSTEM_NAMESPACE:
        return None
    return (meta.get("annotations") or {}).get("gpupool.io/node-name", ""), int(labels["gpupool.io/device"])


class PodWatch:
    """The pods and device reservations gpupool made, by allocation id and by (node, device), with what the
    backend remembers about them between events. `lock` guards every field here."""

    def __init__(
        self,
        core: Any,
        on_change: Callable[[], None],
        *,
        timeout_s: int = 60,
        stale_after_s: float = 30.0,
        unseen_for_s: float = 120.0,
        scheduler: str = SCHEDULER,
        namespace_prefix: str = "gpupool-",
    ) -> None:
        import kubernetes

        k8s: Any = kubernetes
        self._k8s = k8s
        self._core = core
        self._on_change = on_change
        self._timeout_s = timeout_s
        self._stale_after_s = stale_after_s
        self.unseen_for_s = unseen_for_s
        self.scheduler = scheduler
        self.namespace_prefix = namespace_prefix
        self._to_dict: Callable[[Any], dict[str, Any]] = k8s.client.ApiClient().sanitize_for_serialization
        self.lock = threading.Lock()
        self.pods: dict[str, dict[str, Any]] = {}
        """Allocation id → its pod, as the API server writes it (camelCase keys)."""
        self.reservations: dict[tuple[str, int], str] = {}
        """(node, device) → the name of the pod holding the whole device for its sharers."""
        self.launching: dict[tuple[str, int], set[str]] = {}
        """Devices whose sharer pods are being created, until the watch shows them."""
        self.unseen: dict[str, Unseen] = {}
        self.foreign: dict[str, ForeignPod] = {}
        """Pod uid → a pod gpupool did not make that names its scheduler (bound by gpupool or not)."""
        self.foreign_generation = 0
        """Counts changes to `foreign`: a reader that saw this number has nothing new to read."""
        self.used: dict[str, NodeUse] = {}
        self.claims: dict[str, tuple[int, int]] = {}
        """The uid of a pod gpupool did not make → the workload and member it is (from the store, through the
        control loop): such a pod stands for an allocation only if it is that member's, whatever its annotations
        say."""
        self.unclaimed: dict[str, tuple[str, dict[str, Any]]] = {}
        """Pod uid → (allocation, pod) for pods gpupool did not make whose allocation annotation nobody vouches for
        (yet: the control loop's claims come after the first list)."""
        """Pod uid → what a pod another scheduler placed holds on its node, while it can run."""
        self.forgotten: set[str] = set()
        self.lists = 0
        """Full lists made (the first, and one per 410 Gone)."""
        self.watches = 0
        """Watch requests the API server accepted (each resumes from the last resourceVersion)."""
        self.resource_version: str | None = None
        self._listed = threading.Event()
        self._failing_since: float | None = None
        self._stopping = threading.Event()
        self._stream: Any = None
        self._thread = threading.Thread(target=self._run, name="gpupool-kube-watch", daemon=True)

    def start(self, wait_s: float) -> None:
        self._thread.start()
        self._listed.wait(wait_s)

    def stop(self) -> None:
        self._stopping.set()
        stream = self._stream
        if stream is not None:
            stream.stop()

    def fresh(self, now: float) -> bool:
        """Whether absence from the view means a pod is gone: the first list is done, and the watch has not
        been failing for longer than the bound (until then, what it holds is at worst a little late)."""
        with self.lock:
            failing = self._failing_since
        return self._listed.is_set() and (failing is None or now - failing < self._stale_after_s)

    def launched(self, alloc: str, name: str, namespace: str) -> None:
        with self.lock:
            if alloc not in self.pods:
                self.unseen[alloc] = Unseen(name, namespace, time.monotonic() + self.unseen_for_s)

    # -- the loop ---------------------------------------------------------------------------------------------
    def _run(self) -> None:
        api_exception = self._k8s.client.ApiException
        while not self._stopping.is_set():
            try:
                if self.resource_version is None:
                    self._relist()
                self._follow()
            except api_exception as e:
                if e.status == GONE:
                    log.info("pod watch: version %s is too old (410 Gone); listing again", self.resource_version)
                    self.resource_version = None
                else:
                    self._failed(e)
            except Exception as e:  # the API server restarted or the connection dropped: resume shortly
                self._failed(e)

    def _failed(self, error: Exception) -> None:
        if self._stopping.is_set():
            return
        with self.lock:
            if self._failing_since is None:
                self._failing_since = time.monotonic()
        log.warning("pod watch interrupted (%s); resuming", type(error).__name__, exc_info=True)
        self._stopping.wait(1.0)

    def _relist(self) -> None:
        listing = self._core.list_pod_for_all_namespaces()
        pods: dict[str, dict[str, Any]] = {}
        reservations: dict[tuple[str, int], str] = {}
        foreign: dict[str, ForeignPod] = {}
        used: dict[str, NodeUse] = {}
        unclaimed: dict[str, tuple[str, dict[str, Any]]] = {}
        for item in listing.items:  # built apart: readers keep the old view until the swap
            pod = self._to_dict(item)
            key = reservation_key(pod)
            if key is not None:
                reservations[key] = pod["metadata"]["name"]
                continue
            alloc, theirs, use = self._sort(pod)
            if alloc and self._vouched(alloc, pod):
                pods[alloc] = pod
            elif alloc:
                unclaimed[pod["metadata"]["uid"]] = (alloc, pod)
            if theirs is not None:
                foreign[theirs.uid] = theirs
            if use is not None:
                used[pod["metadata"]["uid"]] = use
        with self.lock:
            self.pods, self.reservations, self.foreign, self.used = pods, reservations, foreign, used
            self.unclaimed = unclaimed
            self.foreign_generation += 1
            for alloc in pods:
                self._seen(alloc)
            self.forgotten &= pods.keys()
            self.lists += 1
            self._failing_since = None
        self.resource_version = listing.metadata.resource_version
        self._listed.set()
        self._on_change()

    def _follow(self) -> None:
        """One watch request, from the last resourceVersion, until the server ends it (normally: its timeout)."""
        w = self._k8s.watch.Watch()
        self._stream = w
        list_pods = self._core.list_pod_for_all_namespaces

        def connect(*args: Any, **kwargs: Any) -> Any:
            """The watch request. Its docstring names no return type, so the watch hands over each pod as the API's
            JSON, never built into a V1Pod and back into a dict: half of the view's cost under a burst."""
            response = list_pods(*args, **kwargs)
            with self.lock:  # the server answered: the view is live again
                self._failing_since = None
                self.watches += 1
            return response

        if self._stopping.is_set():
            return
        for event in w.stream(
            connect,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._timeout_s,
            # The server ends the watch at its timeout: silence well past that is a connection gone dead.
            _request_timeout=(10, self._timeout_s + 15),
        ):
            if self._stopping.is_set():
                return
            obj = event["object"]
            if event["type"] != "BOOKMARK":
                self._apply(event["type"], obj)
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if version:
                self.resource_version = version
            if event["type"] != "BOOKMARK":
                self._on_change()

    def _apply(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        with self.lock:
            key = reservation_key(pod)
            if key is not None:
                if kind == "DELETED":
                    self.reservations.pop(key, None)
                else:
                    self.reservations[key] = meta["name"]
                return
            alloc, theirs, use = self._sort(pod)
            uid = meta.get("uid", "")
            if kind == "DELETED" or use is None:
                self.used.pop(uid, None)
            else:
                self.used[uid] = use
            if theirs is not None:
                if kind == "DELETED":
                    self.foreign.pop(uid, None)
                else:
                    self.foreign[uid] = theirs
                self.foreign_generation += 1
            self.unclaimed.pop(uid, None)
            if not alloc:
                return
            held = self.pods.get(alloc)
            if held is not None and held["metadata"].get("uid") != uid and kind == "DELETED":
                return  # another pod naming the same allocation: not the one the view holds
            if kind == "DELETED":
                self.pods.pop(alloc, None)
                self.forgotten.discard(alloc)
            elif self._vouched(alloc, pod):
                self.pods[alloc] = pod
            else:
                self.unclaimed[uid] = (alloc, pod)
                return
            self._seen(alloc)

    def claim(self, claims: dict[str, tuple[int, int]]) -> None:
        """The foreign pods the store has workloads for (pod uid → workload id and member): those naming an
        allocation of their own member's stand for it from now on; any other pod naming one does not."""
        with self.lock:
            self.claims = dict(claims)
            for alloc, pod in list(self.pods.items()):
                if not self._vouched(alloc, pod):
                    del self.pods[alloc]
                    self.unclaimed[pod["metadata"]["uid"]] = (alloc, pod)
            for uid, (alloc, pod) in list(self.unclaimed.items()):
                if self._vouched(alloc, pod):
                    del self.unclaimed[uid]
                    self.pods[alloc] = pod
                    self._seen(alloc)

    def _vouched(self, alloc: str, pod: dict[str, Any]) -> bool:
        """gpupool's own pods (its label, in its namespaces) stand for the allocation they name; a pod it did not
        make only if the store has it as that allocation's workload's pod."""
        if self._ours(pod):
            return True
        claim = self.claims.get(pod["metadata"].get("uid", ""))
        # An allocation's id is <workload>-<attempt>-<member>.
        parts = alloc.split("-")
        return claim is not None and len(parts) == 3 and parts[0] == str(claim[0]) and parts[2] == str(claim[1])

    def _ours(self, pod: dict[str, Any]) -> bool:
        meta = pod["metadata"]
        ns = meta.get("namespace", "")
        in_ours = ns == SYSTEM_NAMESPACE or ns.startswith(self.namespace_prefix)
        return in_ours and (meta.get("labels") or {}).get(MANAGED) == "true"

    def _sort(self, pod: dict[str, Any]) -> tuple[str | None, ForeignPod | None, NodeUse | None]:
        """A pod's allocation (gpupool's pods, and the foreign pods it bound), the pod as a foreign one (it names
        gpupool's scheduler; gpupool did not make it), and what it holds on its node if someone else placed it."""
        meta, spec = pod["metadata"], pod.get("spec") or {}
        ours = self._ours(pod)
        named = spec.get("schedulerName") == self.scheduler
        alloc = (meta.get("annotations") or {}).get(ALLOC) if ours or named else None
        theirs = foreign_pod(pod, quantity) if named and not ours else None
        return alloc, theirs, None if ours or alloc else node_use(pod, quantity)

    def _seen(self, alloc: str) -> None:
        self.unseen.pop(alloc, None)
        for allocs in self.launching.values():
            allocs.discard(alloc)
