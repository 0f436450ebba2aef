"""The deployment manifests are accepted by a real API server (server-side dry run), RBAC included."""

from __future__ import annotations

from pathlib import Path

import yaml

from kubernetes import client, utils
from tests.kubernetes.cluster import Cluster

MANIFESTS = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "gpupool.yaml"


def test_the_manifests_pass_a_server_side_dry_run(cluster: Cluster) -> None:
    docs = [d for d in yaml.safe_load_all(MANIFESTS.read_text()) if d]
    kinds = [d["kind"] for d in docs]
    assert kinds == ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service"]
    api = cluster.api()
    core = client.CoreV1Api(api)
    if "gpupool-system" not in [n.metadata.name for n in core.list_namespace().items]:
        core.create_namespace(docs[0])  # namespaced objects need it to exist, even in a dry run
    for doc in docs[1:]:
        utils.create_from_dict(api, doc, dry_run="All")
    role = docs[2]
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert "*" not in verbs and not any("*" in rule["resources"] for rule in role["rules"])
