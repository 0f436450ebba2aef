"""The deployment manifests are accepted by a real API server (server-side dry run), and their RBAC grants exactly
what gpupool uses: the API server's own authorizer answers, through SubjectAccessReviews, for every verb on every
resource the ClusterRole names and on neighbours it must not reach."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kubernetes import client, utils
from tests.kubernetes.cluster import Cluster

MANIFESTS = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "gpupool.yaml"
ACCOUNT = "system:serviceaccount:gpupool-system:gpupool"
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
# (API group, resource, subresource) -> the verbs granted. Cluster-scoped resources are asked without a namespace.
GRANTED: dict[tuple[str, str, str], set[str]] = {
    ("", "nodes", ""): {"get", "list", "watch"},
    ("", "pods", ""): {"get", "list", "watch", "create", "delete"},
    ("", "pods", "log"): {"get"},
    ("", "pods", "exec"): {"get", "create"},
    ("", "pods", "attach"): {"get", "create"},
    ("", "pods", "portforward"): {"get", "create"},
    ("", "services", ""): {"get", "list", "create", "delete"},
    ("", "persistentvolumeclaims", ""): {"create", "delete"},
    ("", "secrets", ""): {"get", "create", "update", "delete"},
    ("", "namespaces", ""): {"get", "list", "create", "patch"},
    ("networking.k8s.io", "networkpolicies", ""): {"create"},
    ("", "pods", "binding"): {"create"},
    ("", "bindings", ""): {"create"},
    ("", "pods", "status"): {"patch", "update"},
    ("", "events", ""): {"create", "patch"},
    ("events.k8s.io", "events", ""): {"create", "patch"},
    ("batch", "jobs", ""): {"get", "list", "watch", "patch", "update"},
    ("jobset.x-k8s.io", "jobsets", ""): {"get", "list", "watch", "patch", "update"},
    ("scheduling.x-k8s.io", "podgroups", ""): {"get", "list", "watch"},
    **{("kubeflow.org", kind, ""): {"get"} for kind in ("pytorchjobs", "tfjobs", "mpijobs", "xgboostjobs")},
    ("ray.io", "rayclusters", ""): {"get"},
    ("scheduling.k8s.io", "priorityclasses", ""): {"get", "list", "watch"},
    # Neighbours: nothing at all.
    ("", "pods", "eviction"): set(),
    ("", "pods", "proxy"): set(),
    ("", "nodes", "proxy"): set(),
    ("", "nodes", "status"): set(),
    ("", "configmaps", ""): set(),
    ("", "serviceaccounts", "token"): set(),
    ("", "persistentvolumes", ""): set(),
    ("batch", "jobs", "status"): set(),
    ("batch", "cronjobs", ""): set(),
    ("apps", "deployments", ""): set(),
    ("rbac.authorization.k8s.io", "clusterroles", ""): set(),
    ("rbac.authorization.k8s.io", "rolebindings", ""): set(),
}
CLUSTER_SCOPED = {"nodes", "namespaces", "priorityclasses", "persistentvolumes", "clusterroles"}


def documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFESTS.read_text()) if d]


def make_namespace(cluster: Cluster, body: dict[str, Any]) -> None:
    core = client.CoreV1Api(cluster.api())
    if body["metadata"]["name"] not in [n.metadata.name for n in core.list_namespace().items]:
        core.create_namespace(body)  # namespaced objects need it to exist, even in a dry run


def test_the_manifests_pass_a_server_side_dry_run(cluster: Cluster) -> None:
    docs = documents()
    kinds = [d["kind"] for d in docs]
    assert kinds == ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service"]
    make_namespace(cluster, docs[0])
    api = cluster.api()
    for doc in docs[1:]:
        utils.create_from_dict(api, doc, dry_run="All")
    role = docs[2]
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert "*" not in verbs and not any("*" in rule["resources"] for rule in role["rules"])


def allowed(authz: client.AuthorizationV1Api, verb: str, group: str, resource: str, subresource: str) -> bool:
    attributes = {"verb": verb, "group": group, "resource": resource, "subresource": subresource}
    if resource not in CLUSTER_SCOPED:
        attributes["namespace"] = "gpupool-vision"  # any namespace: the role is cluster-wide
    review = {
        "spec": {
            "user": ACCOUNT,
            "groups": ["system:serviceaccounts", "system:serviceaccounts:gpupool-system", "system:authenticated"],
            "resourceAttributes": attributes,
        }
    }
    return bool(authz.create_subject_access_review(review).status.allowed)


def test_the_service_account_may_do_what_the_server_does_and_nothing_near_it(cluster: Cluster) -> None:
    docs = {d["kind"]: d for d in documents()}
    make_namespace(cluster, docs["Namespace"])
    api = cluster.api()
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        utils.create_from_dict(api, docs[kind])
    authz = client.AuthorizationV1Api(api)
    granted = {
        (group, resource, sub): {v for v in VERBS if allowed(authz, v, group, resource, sub)}
        for group, resource, sub in GRANTED
    }
    assert granted == GRANTED
