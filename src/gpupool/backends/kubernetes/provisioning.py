"""Asking a cluster's autoscaler for capacity the Kubernetes way: a `ProvisioningRequest` (autoscaling.x-k8s.io/v1,
which cluster-autoscaler implements) for N nodes' worth of pods, each pod shaped like one burst node, as Kueue's
ProvisioningRequest admission check does. The autoscaler adds the nodes and says so in the request's conditions;
deleting the request gives the capacity back (the autoscaler removes nodes left empty).

Every call is idempotent by the request's name: asking twice makes one request, giving back one already gone is
done. The pod template a request names is `ppt-<request>` (Kueue's convention), in the same namespace."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

GROUP, VERSION, PLURAL = "autoscaling.x-k8s.io", "v1", "provisioningrequests"
BEST_EFFORT = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
"""The class that scales the cluster up (all nodes or none); check-capacity only books what exists."""
NAMESPACE = "gpupool-burst"
MANAGED = "gpupool.io/managed"
DEPARTMENT = "gpupool.io/department"
REQUEST = "gpupool.io/burst-request"
"""The label gpupool puts on a node it attributes to a request: the cluster says which node each request became."""
TIMEOUT_S = 10.0
"""Each call's limit: an unreachable cluster delays the hub's burst step by this much at most, not indefinitely."""


class ProvisioningState(StrEnum):
    PENDING = "pending"
    """Asked; the autoscaler has not said yet."""
    PROVISIONED = "provisioned"
    FAILED = "failed"
    BOOKING_EXPIRED = "booking-expired"
    """Provisioned, and its booking lapsed (10 min after): the nodes are ordinary ones now."""
    CAPACITY_REVOKED = "capacity-revoked"


@dataclass(frozen=True, slots=True)
class Provisioning:
    name: str
    state: ProvisioningState
    nodes: int
    department: str
    message: str = ""
    created: str = ""
    """When the API server made it (RFC 3339)."""


def template_name(request: str) -> str:
    return f"ppt-{request}"


def pod_template(request: str, gpus: int, cpu_milli: int, memory_mib: int) -> dict[str, Any]:
    """One node's worth of work: the autoscaler sizes its scale-up from these pods' requests."""
    resources = {"nvidia.com/gpu": str(gpus), "cpu": f"{cpu_milli}m", "memory": f"{memory_mib}Mi"}
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": template_name(request), "labels": {MANAGED: "true"}},
        "template": {
            "metadata": {"labels": {MANAGED: "true"}},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "burst",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": resources, "limits": {"nvidia.com/gpu": str(gpus)}},
                    }
                ],
            },
        },
    }


def _state(obj: dict[str, Any]) -> tuple[ProvisioningState, str]:
    """The request's state from its conditions, the latest word first (a revoked or expired booking outranks the
    provisioning it ends)."""
    conditions = {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}
    for kind, state in (
        ("CapacityRevoked", ProvisioningState.CAPACITY_REVOKED),
        ("BookingExpired", ProvisioningState.BOOKING_EXPIRED),
        ("Failed", ProvisioningState.FAILED),
        ("Provisioned", ProvisioningState.PROVISIONED),
    ):
        c = conditions.get(kind)
        if c is not None and c.get("status") == "True":
            return state, str(c.get("message") or c.get("reason") or "")
    pending = conditions.get("Provisioned") or conditions.get("Accepted") or {}
    return ProvisioningState.PENDING, str(pending.get("message") or "")


class BurstProvider(Protocol):
    """Where burst capacity is rented: a cluster's autoscaler through ProvisioningRequests (Provisioner, below), or
    a GPU cloud's own API where a cluster has no such autoscaler (RunPod, CoreWeave, Lambda: not built yet, their
    APIs cannot be reached from here). Each call is idempotent by the request's name."""

    def ask(self, name: str, nodes: int, department: str, template: dict[str, Any]) -> None: ...

    def list(self) -> dict[str, Provisioning]: ...

    def claim(self, name: str, node: str) -> None:
        """Mark `node` (the cluster's own name for it) as what request `name` became."""
        ...

    def give_back(self, name: str, node: str | None = None) -> None:
        """Give the request's capacity back; `node`, where one was attributed, takes no new work first."""
        ...


class Provisioner:
    """ProvisioningRequests in one cluster, in their own namespace, through its API client (a BurstProvider)."""

    def __init__(
        self, api_client: Any, namespace: str = NAMESPACE, class_name: str = BEST_EFFORT, timeout_s: float = TIMEOUT_S
    ) -> None:
        from kubernetes import client

        self._errors = client.exceptions.ApiException
        self.core: Any = client.CoreV1Api(api_client)  # called with plain dicts, as the rest of the backend does
        self.custom: Any = client.CustomObjectsApi(api_client)
        self.namespace = namespace
        self.class_name = class_name
        self.timeout = timeout_s

    def ask(self, name: str, nodes: int, department: str, template: dict[str, Any]) -> None:
        """Ask for `nodes` nodes shaped like `template` (pod_template) for a department; done already is done."""
        t = self.timeout
        self._exists(lambda: self.core.create_namespace({"metadata": {"name": self.namespace}}, _request_timeout=t))
        self._exists(lambda: self.core.create_namespaced_pod_template(self.namespace, template, _request_timeout=t))
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ProvisioningRequest",
            "metadata": {"name": name, "labels": {MANAGED: "true", DEPARTMENT: department}},
            "spec": {
                "provisioningClassName": self.class_name,
                "podSets": [{"podTemplateRef": {"name": template["metadata"]["name"]}, "count": nodes}],
            },
        }
        self._exists(
            lambda: self.custom.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, body, _request_timeout=t
            )
        )

    def list(self) -> dict[str, Provisioning]:
        found = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, label_selector=f"{MANAGED}=true", _request_timeout=self.timeout
        )
        out = {}
        for obj in found.get("items", []):
            meta = obj["metadata"]
            state, message = _state(obj)
            count = sum(int(p.get("count", 0)) for p in obj.get("spec", {}).get("podSets", []))
            out[meta["name"]] = Provisioning(
                meta["name"], state, count, (meta.get("labels") or {}).get(DEPARTMENT, ""), message,
                meta.get("creationTimestamp", ""),
            )  # fmt: skip
        return out

    def claim(self, name: str, node: str) -> None:
        self.core.patch_node(node, {"metadata": {"labels": {REQUEST: name}}}, _request_timeout=self.timeout)

    def give_back(self, name: str, node: str | None = None) -> None:
        """Cordon the node it became (so nothing lands on it while the autoscaler removes it), then delete the
        request and its pod template. A node already gone, or a request, is given back already."""
        t = self.timeout
        if node is not None:
            self._gone(lambda: self.core.patch_node(node, {"spec": {"unschedulable": True}}, _request_timeout=t))
        self._gone(
            lambda: self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name, _request_timeout=t
            )
        )
        self._gone(
            lambda: self.core.delete_namespaced_pod_template(template_name(name), self.namespace, _request_timeout=t)
        )

    def _exists(self, call: Any) -> None:
        try:
            call()
        except self._errors as e:
            if e.status != 409:
                raise

    def _gone(self, call: Any) -> None:
        try:
            call()
        except self._errors as e:
            if e.status != 404:
                raise
