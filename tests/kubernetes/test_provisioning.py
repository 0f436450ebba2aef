"""Asking a real API server's autoscaler for burst capacity: ProvisioningRequests made once by name, their state
read from the conditions the autoscaler writes (the test writes them, as cluster-autoscaler would), given back by
deleting them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.backends.kubernetes.provisioning import (
    BEST_EFFORT,
    GROUP,
    NAMESPACE,
    PLURAL,
    VERSION,
    Provisioner,
    ProvisioningState,
    pod_template,
)
from kubernetes import client
from tests.e2e.conftest import wait_for
from tests.kubernetes.cluster import Cluster

CRD = Path(__file__).with_name("provisioningrequest-crd.yaml")


def install_crd(cluster: Cluster) -> None:
    """Register the kind (idempotently) and wait until the API server serves it."""
    ext = client.ApiextensionsV1Api(cluster.api())
    body = yaml.safe_load(CRD.read_text())
    try:
        ext.create_custom_resource_definition(body)
    except client.exceptions.ApiException as e:
        if e.status != 409:
            raise

    def established() -> bool:
        crd = ext.read_custom_resource_definition(body["metadata"]["name"])
        return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])

    wait_for(established, 30, "the ProvisioningRequest kind to be served")


def set_condition(cluster: Cluster, name: str, kind: str, message: str) -> None:
    """What cluster-autoscaler writes once it has (or has not) made the capacity."""
    custom = client.CustomObjectsApi(cluster.api())
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    condition = {"type": kind, "status": "True", "reason": kind, "message": message, "lastTransitionTime": now}
    body: dict[str, Any] = {"status": {"conditions": [condition]}}
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, NAMESPACE, PLURAL, name, body)


@pytest.fixture
def provisioner(cluster: Cluster) -> Provisioner:
    install_crd(cluster)
    return Provisioner(cluster.api())


def test_a_request_is_made_once_its_state_follows_the_autoscaler_and_giving_it_back_removes_it(
    cluster: Cluster, provisioner: Provisioner
) -> None:
    template = pod_template("burst-1", 8, 96000, 1048576)
    provisioner.ask("burst-1", 2, "research", template)
    provisioner.ask("burst-1", 2, "research", template)  # a retry after a crash: still one request
    custom = client.CustomObjectsApi(cluster.api())
    made = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)["items"]
    assert [(o["metadata"]["name"], o["spec"]) for o in made] == [
        ("burst-1", {"provisioningClassName": BEST_EFFORT, "podSets": [{"podTemplateRef": {"name": "ppt-burst-1"},
                                                                         "count": 2}]})
    ]  # fmt: skip
    kept = client.CoreV1Api(cluster.api()).read_namespaced_pod_template("ppt-burst-1", NAMESPACE)
    limits = kept.template.spec.containers[0].resources.limits
    assert limits == {"nvidia.com/gpu": "8"}
    seen = provisioner.list()["burst-1"]
    assert (seen.state, seen.nodes, seen.department) == (ProvisioningState.PENDING, 2, "research")

    set_condition(cluster, "burst-1", "Provisioned", "2 nodes added")
    seen = provisioner.list()["burst-1"]
    assert (seen.state, seen.message) == (ProvisioningState.PROVISIONED, "2 nodes added")

    provisioner.ask("burst-2", 1, "research", pod_template("burst-2", 8, 96000, 1048576))
    set_condition(cluster, "burst-2", "Failed", "no capacity in any zone")
    assert provisioner.list()["burst-2"].state == ProvisioningState.FAILED

    provisioner.give_back("burst-1")
    provisioner.give_back("burst-1")  # given back already: done
    provisioner.give_back("burst-2")
    assert provisioner.list() == {}
    assert client.CoreV1Api(cluster.api()).list_namespaced_pod_template(NAMESPACE).items == []
