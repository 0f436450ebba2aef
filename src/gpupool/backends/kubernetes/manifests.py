"""Pure functions from gpupool's launch specs and nodes to Kubernetes objects and back (plain dicts)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpupool.backends.base import LaunchSpec
from gpupool.backends.kubernetes.volumes import pod_volumes
from gpupool.core import Device, Node
from kubernetes import utils as kube_utils

GPU = "nvidia.com/gpu"
PRODUCT = "nvidia.com/gpu.product"
MEMORY = "nvidia.com/gpu.memory"
MANAGED = "gpupool.io/managed"
ALLOC = "gpupool.io/allocation"
WORKLOAD = "gpupool.io/workload"
WORKLOAD_ID = "gpupool.io/workload-id"
MEMBER = "gpupool.io/member"
DEVICES = "gpupool.io/devices"
SCHEDULER = "gpupool"
SYSTEM_NAMESPACE = "gpupool-system"
RESERVATION = "gpupool.io/reservation"
POD_SECURITY_LEVELS = ("restricted", "baseline")
"""Each is also the Pod Security Admission level its namespace enforces, so the API server holds pods to it."""
PSA_ENFORCE = "pod-security.kubernetes.io/enforce"
PSA_ENFORCE_VERSION = "pod-security.kubernetes.io/enforce-version"
UID_BASE = 1_900_000_000
"""Project p's restricted pods run as uid = gid = UID_BASE + p, as the local backend's sandboxes do."""
NOBODY = 65534
"""Reservation pods only sleep: they run as nobody."""


def dns(text: str, limit: int = 63) -> str:
    out = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return out[:limit].rstrip("-") or "x"


def namespace_for(project: str, prefix: str = "gpupool-") -> str:
    return dns(prefix + project)


def pod_name(spec: LaunchSpec) -> str:
    """Deterministic: a retried launch meets AlreadyExists instead of making a second pod."""
    suffix = f"-{spec.alloc_id}"
    return dns(spec.workload_name, 63 - len(suffix)) + suffix


def gang_service(spec: LaunchSpec) -> str:
    suffix = f"-{spec.workload_id}-{spec.attempt}"
    return dns(spec.workload_name, 63 - len(suffix)) + suffix


def device_uuid(node: str, index: int) -> str:
    """How a device is named to containers on a node without a real driver (kwok, tests)."""
    return f"GPU-{dns(node, 40)}-{index}"


_parse: Callable[[object], Decimal] = kube_utils.parse_quantity
"""The client's own reading of Kubernetes quantities (it is untyped)."""


def quantity(value: object, scale: int) -> int:
    """A resource quantity ("96", "500m", "1Ti") in units of 1/scale, rounded down; 0 where it is not one."""
    try:
        return int(_parse(value) * scale)
    except ValueError:
        return 0


def node_from(obj: Mapping[str, Any], pool_label: str, not_ready: bool) -> Node | None:
    """A Node object as the core sees it; None for nodes without GPUs or CPU to offer."""
    meta, status, spec = obj.get("metadata", {}), obj.get("status", {}), obj.get("spec", {})
    labels = meta.get("labels") or {}
    alloc = status.get("allocatable") or {}
    count = int(alloc.get(GPU, "0") or 0)
    model = str(labels.get(PRODUCT, "GPU")).removeprefix("NVIDIA-")
    memory = int(labels.get(MEMORY, "0") or 0)
    # Taints against everyone but GPU work (the one gpupool's pods tolerate) keep new work off the node. The
    # not-ready and unreachable taints only restate the Ready condition, which is read directly above (and
    # without a controller manager nobody would ever lift them).
    ignored = (GPU, "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
    blocking = [
        t
        for t in (spec.get("taints") or [])
        if t.get("effect") in ("NoSchedule", "NoExecute") and t.get("key") not in ignored
    ]
    schedulable = not spec.get("unschedulable", False) and not not_ready and not blocking
    return Node(
        name=meta["name"],
        pool=str(labels.get(pool_label, "default")),
        cpu_milli=quantity(alloc.get("cpu", "0"), 1000),
        memory_mib=quantity(alloc.get("memory", "0"), 1) // (1024 * 1024),
        devices=tuple(Device(i, model, memory) for i in range(count)),
        schedulable=schedulable,
    )


def granted(pod: Mapping[str, Any]) -> list[tuple[int, int]]:
    """(device index, milli-GPU) of each device granted to a pod gpupool made or bound, from its annotation."""
    text = (pod["metadata"].get("annotations") or {}).get(DEVICES, "")
    return [(int(i), int(m)) for i, m in (part.split(":") for part in text.split(",") if part)]


def ready(obj: Mapping[str, Any]) -> bool:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def check_level(level: str) -> str:
    if level not in POD_SECURITY_LEVELS:
        raise ValueError(f"pod security {level!r}: expected one of {', '.join(POD_SECURITY_LEVELS)}")
    return level


def security_contexts(level: str, uid: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod's and the container's securityContext at a level. Both levels keep the RuntimeDefault seccomp
    profile and refuse privilege and its escalation; "restricted" also runs as a non-root `uid` (group and
    fsGroup the same) with every capability dropped, which is what Pod Security's `restricted` demands. The
    root filesystem stays writable: images write to /tmp, caches and package directories."""
    check_level(level)
    seccomp = {"seccompProfile": {"type": "RuntimeDefault"}}
    container: dict[str, Any] = {"allowPrivilegeEscalation": False, "privileged": False}
    if level == "baseline":
        return seccomp, container
    pod = {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid, **seccomp}
    return pod, {**container, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": False}


def namespace_manifest(name: str, level: str) -> dict[str, Any]:
    """A namespace gpupool made, whose Pod Security Admission labels make the API server enforce `level`."""
    labels = {MANAGED: "true", PSA_ENFORCE: check_level(level), PSA_ENFORCE_VERSION: "latest"}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


ISOLATION_POLICY = "gpupool-project-isolation"
"""The NetworkPolicy in each project's namespace."""


def network_policy_manifest(namespace: str, server_namespace: str) -> dict[str, Any]:
    """A project's pods take connections from the project's own pods (a gang's members, its services' clients in
    the project) and from the server's namespace (the app proxy) alone: another project's pods are refused, as a
    tenant's notebook on the local backend is reached only through the proxy. Their own connections out are
    theirs (downloads, a tracking server)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": ISOLATION_POLICY, "namespace": namespace, "labels": {MANAGED: "true"}},
        "spec": {
            "podSelector": {},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [
                {"podSelector": {}},
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": server_namespace}}},
            ]}],
        },
    }  # fmt: skip


def _confined(pod_spec: dict[str, Any], security: dict[str, Any]) -> dict[str, Any]:
    """Never the node's network, process or IPC namespaces (and no volumes but the code's emptyDir: no hostPath)."""
    return {**pod_spec, "hostNetwork": False, "hostPID": False, "hostIPC": False, "securityContext": security}


SECRETS = "gpupool-project-secrets"
"""The Secret in a project's namespace holding the project's secrets."""


def secrets_manifest(values: Mapping[str, str], namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRETS, "namespace": namespace, "labels": {MANAGED: "true"}},
        "type": "Opaque",
        "stringData": dict(sorted(values.items())),
    }


CODE_DIR = "/workspace"
"""Where a pod's code is fetched to, and where its main container starts."""


CODE_TOKEN_KEY = "token"
"""The key of a code Secret's token."""


@dataclass(frozen=True, slots=True)
class CodeFetch:
    """How a pod's init step fetches its workload's code from the server (no shared filesystem is assumed)."""

    url: str
    """The server's API as pods reach it."""
    token: str
    """Minted by the server for this workload (gpupool.services.code.mint_token): it reads this workload's code
    and nothing else. It goes in a Secret of the pod's own (code_secret_manifest), never in the pod spec, which
    more than the project read."""
    image: str
    """An image with gpupool's client (`pip install gpupool`): it runs `python -m gpupool.client.code`."""


def code_secret(pod: str) -> str:
    """The Secret holding a pod's code token: named after the pod (one per launch, so it goes when the pod does;
    a retried launch meets AlreadyExists with the same token)."""
    return f"{pod}-code"


def code_secret_manifest(spec: LaunchSpec, namespace: str, fetch: CodeFetch) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": code_secret(pod_name(spec)),
            "namespace": namespace,
            "labels": {MANAGED: "true", WORKLOAD_ID: str(spec.workload_id)},
            "annotations": {ALLOC: spec.alloc_id},
        },
        "type": "Opaque",
        "stringData": {CODE_TOKEN_KEY: fetch.token},
    }


def code_init_container(spec: LaunchSpec, fetch: CodeFetch, security: dict[str, Any]) -> dict[str, Any]:
    token = {"secretKeyRef": {"name": code_secret(pod_name(spec)), "key": CODE_TOKEN_KEY}}
    return {
        "name": "code",
        "image": fetch.image,
        "command": ["python", "-m", "gpupool.client.code", "--into", CODE_DIR],
        "env": [
            {"name": "GPUPOOL_CODE_TOKEN", "valueFrom": token},
            {"name": "GPUPOOL_URL", "value": fetch.url},
            {"name": "GPUPOOL_WORKLOAD_ID", "value": str(spec.workload_id)},
        ],
        "volumeMounts": [{"name": "code", "mountPath": CODE_DIR}],
        "securityContext": security,
    }


def pod_manifest(
    spec: LaunchSpec, namespace: str, default_image: str, uid_base: int = UID_BASE, code: CodeFetch | None = None
) -> dict[str, Any]:
    """`code`: where the workload has code, how its init step fetches it into an emptyDir the main container
    starts in (its token from the Secret code_secret_manifest makes, which the pod needs before it starts)."""
    pod_security, container_security = security_contexts(spec.pod_security, uid_base + spec.project_id)
    whole = [d for d in spec.devices if d.milli >= 1000]
    shared = [d for d in spec.devices if d.milli < 1000]
    env = dict(spec.env)
    env.update(
        {
            "GPUPOOL_WORKLOAD": spec.workload_name,
            "GPUPOOL_PROJECT": spec.project,
            "GPUPOOL_ALLOCATION": spec.alloc_id,
        }
    )
    if shared:
        # As KAI-Scheduler does it: a reservation pod holds the whole device; sharers name it and get their
        # limits in the environment.
        d = shared[0]
        env["NVIDIA_VISIBLE_DEVICES"] = device_uuid(spec.node, d.index)
        env["GPUPOOL_GPU_FRACTION"] = f"{d.milli / 1000:.3f}"
        env["GPUPOOL_GPU_MEMORY_LIMIT_MIB"] = str(d.memory_mib)
    elif not whole:
        env["NVIDIA_VISIBLE_DEVICES"] = "none"
    if spec.port is not None:
        env["PORT"] = str(spec.port)
    if spec.pod_security == "restricted":
        # Its uid has no passwd entry in the image, so HOME would be "/", where it cannot write its caches.
        env.setdefault("HOME", "/tmp")
    labels = {
        MANAGED: "true",
        WORKLOAD_ID: str(spec.workload_id),
        WORKLOAD: dns(spec.workload_name),
        MEMBER: str(spec.rank),
        "gpupool.io/attempt": str(spec.attempt),
    }
    pod_spec: dict[str, Any] = {
        "schedulerName": SCHEDULER,
        "nodeName": spec.node,
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": int(spec.grace_s),
        "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [],
    }
    if spec.world_size > 1:
        service = gang_service(spec)
        pod_spec["hostname"] = dns(f"rank-{spec.rank}")
        pod_spec["subdomain"] = service
        env.update(
            {
                "MASTER_ADDR": f"rank-0.{service}.{namespace}.svc",
                "MASTER_PORT": str(spec.master_port or 29500),
                "WORLD_SIZE": str(spec.world_size),
                "RANK": str(spec.rank),
                "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "1",
                "GROUP_RANK": str(spec.rank),
            }
        )
        labels["gpupool.io/gang"] = service
    resources: dict[str, Any] = {"limits": {}, "requests": {}}
    if whole:
        resources["limits"][GPU] = str(len(whole))
    if spec.cpu_milli:
        resources["requests"]["cpu"] = f"{spec.cpu_milli}m"
    if spec.memory_mib:
        resources["requests"]["memory"] = f"{spec.memory_mib}Mi"
    container: dict[str, Any] = {
        "name": "main",
        "image": spec.image or default_image,
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "resources": resources,
        "securityContext": container_security,
        # Open for `gpupool attach` (never closed: stdinOnce unset), as the local backend's FIFO is.
        "stdin": True,
    }
    if spec.secrets:
        # From the project's Secret, not spelled out here: the pod spec is read by more than the project.
        container["envFrom"] = [{"secretRef": {"name": SECRETS}}]
    if spec.argv:
        container["command"] = list(spec.argv)
    if spec.init:  # a pod has the network its command has: one container runs both, in a directory of its own
        container["command"] = ["/bin/sh", "-c", f'{shlex.join(spec.init)} && exec "$@"', "gpupool-init", *spec.argv]
        if code is None:
            pod_spec["volumes"] = [{"name": "code", "emptyDir": {}}]
            container["volumeMounts"] = [{"name": "code", "mountPath": CODE_DIR}]
            container["workingDir"] = CODE_DIR
    if spec.port is not None:
        container["ports"] = [{"containerPort": spec.port}]
    if code is not None:
        pod_spec["volumes"] = [{"name": "code", "emptyDir": {}}]
        pod_spec["initContainers"] = [code_init_container(spec, code, container_security)]
        container["volumeMounts"] = [{"name": "code", "mountPath": CODE_DIR}]
        container["workingDir"] = CODE_DIR
    if spec.volumes:
        claims, mounts = pod_volumes(spec)
        pod_spec["volumes"] = [*pod_spec.get("volumes", []), *claims]
        container["volumeMounts"] = [*container.get("volumeMounts", []), *mounts]
    pod_spec["containers"].append(container)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(spec),
            "namespace": namespace,
            "labels": labels,
            "annotations": {
                ALLOC: spec.alloc_id,
                DEVICES: ",".join(f"{d.index}:{d.milli}" for d in spec.devices),
            },
        },
        "spec": _confined(pod_spec, pod_security),
    }


def reservation_manifest(node: str, index: int, image: str) -> dict[str, Any]:
    name = dns(f"reservation-{node}", 55) + f"-{index}"
    pod_security, container_security = security_contexts("restricted", NOBODY)
    hold = {
        "name": "hold",
        "image": image,
        "command": ["sleep", "infinity"],
        "resources": {"limits": {GPU: "1"}},
        "securityContext": container_security,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": SYSTEM_NAMESPACE,
            "labels": {
                MANAGED: "true",
                RESERVATION: "true",
                "gpupool.io/node": dns(node),
                "gpupool.io/device": str(index),
            },
            "annotations": {"gpupool.io/node-name": node},
        },
        "spec": _confined(
            {
                "schedulerName": SCHEDULER,
                "nodeName": node,
                "restartPolicy": "Never",
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 0,
                "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [hold],
            },
            pod_security,
        ),
    }


def gang_service_manifest(spec: LaunchSpec, namespace: str) -> dict[str, Any]:
    name = gang_service(spec)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": {MANAGED: "true"}},
        "spec": {"clusterIP": "None", "selector": {"gpupool.io/gang": name}, "publishNotReadyAddresses": True},
    }
