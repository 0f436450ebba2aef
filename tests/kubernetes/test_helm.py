"""The Helm chart (deploy/helm/gpupool), rendered and linted by a real helm (built by scripts/build-helm) and its
objects sent to a real API server: the same Deployment, RBAC and Service as deploy/kubernetes/gpupool.yaml, so the
two cannot drift; a budget; the scheduler name passed on; an optional ServiceMonitor, dry-run against
prometheus-operator's own CRD (from its Go module, pinned); bad values refused by the schema; and the docs' install
and upgrade run as printed."""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shlex
import subprocess
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubernetes import client, utils
from tests.kubernetes.cluster import Cluster
from tests.kubernetes.controllers import poll

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "gpupool"
MANIFESTS = REPO / "deploy" / "kubernetes" / "gpupool.yaml"
DOCS = REPO / "docs" / "kubernetes.md"
NAMESPACE = "gpupool-system"
SELECTOR = {"app.kubernetes.io/name": "gpupool", "app.kubernetes.io/instance": "gpupool"}
MADE_SECRET = ("--set", "database.existingSecret=,database.url=postgresql://gpupool@db:5432/gpupool")
# The CRD the ServiceMonitor is checked against: prometheus-operator's, from its Go module (4 MB, cached by Go).
PROMETHEUS_OPERATOR = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
SERVICE_MONITOR_CRD = "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml"


@functools.cache
def helm_binary() -> Path:
    done = subprocess.run([str(REPO / "scripts" / "build-helm")], capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/build-helm failed: {done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1]) / "helm"


@pytest.fixture(scope="module")
def helm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """helm's caches, config and data in a folder of this module's, and no cluster unless a test names one."""
    home = tmp_path_factory.mktemp("helm")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HELM_", "KUBECONFIG"))}
    env["PATH"] = f"{helm_binary().parent}{os.pathsep}{env.get('PATH', '')}"
    for name in ("CACHE", "CONFIG", "DATA"):
        env[f"HELM_{name}_HOME"] = str(home / name.lower())
    return env


def helm(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["helm", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)


def render(env: dict[str, str], *values: str) -> list[dict[str, Any]]:
    done = helm(env, "template", "gpupool", str(CHART), "--namespace", NAMESPACE, *values)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def by_kind(docs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in docs}


def manifests() -> dict[str, dict[str, Any]]:
    return by_kind([d for d in yaml.safe_load_all(MANIFESTS.read_text()) if d])


def test_the_charts_app_version_is_the_packages() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert (chart["apiVersion"], chart["appVersion"]) == ("v2", project["version"])


@pytest.mark.parametrize("values", [(), (*MADE_SECRET, "--set", "database.password=pw,tls.existingSecret=tls")])
def test_helm_lint_passes(helm_env: dict[str, str], values: tuple[str, ...]) -> None:
    done = helm(helm_env, "lint", "--strict", str(CHART), *values)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


def test_the_defaults_render_the_manifests_objects_and_a_budget(helm_env: dict[str, str]) -> None:
    docs = render(helm_env)
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == [
        ("ClusterRole", "gpupool"),
        ("ClusterRoleBinding", "gpupool"),
        ("Deployment", "gpupool"),
        ("PodDisruptionBudget", "gpupool"),
        ("Service", "gpupool"),
        ("ServiceAccount", "gpupool"),
    ]
    chart, plain = by_kind(docs), manifests()
    assert chart["ClusterRole"]["rules"] == plain["ClusterRole"]["rules"]
    assert chart["ClusterRoleBinding"]["subjects"] == plain["ClusterRoleBinding"]["subjects"]
    assert chart["ClusterRoleBinding"]["roleRef"] == plain["ClusterRoleBinding"]["roleRef"]

    deployment = chart["Deployment"]["spec"]
    assert deployment["replicas"] == 2
    assert deployment["selector"] == {"matchLabels": SELECTOR}
    pod = deployment["template"]["spec"]
    assert pod["containers"][0]["readinessProbe"] == {
        "httpGet": {"path": "/readyz", "port": "http"},
        "periodSeconds": 5,
    }
    # The manifest's Deployment, but for Helm's labels, the pull policy and the lease's length made explicit.
    expected = copy.deepcopy(plain["Deployment"]["spec"])
    expected["selector"] = {"matchLabels": SELECTOR}
    term = expected["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    term[0]["podAffinityTerm"]["labelSelector"] = {"matchLabels": SELECTOR}
    container = expected["template"]["spec"]["containers"][0]
    container["args"] += ["--lease-ttl", "10"]
    container["imagePullPolicy"] = "IfNotPresent"
    assert {k: v for k, v in deployment.items() if k != "template"} == {
        k: v for k, v in expected.items() if k != "template"
    }
    assert pod == expected["template"]["spec"]
    assert {"name": "GPUPOOL_SCHEDULER_NAME", "value": "gpupool"} in pod["containers"][0]["env"]
    assert deployment["template"]["metadata"] == {
        "labels": {
            **SELECTOR,
            "helm.sh/chart": "gpupool-0.2.0",
            "app.kubernetes.io/version": "0.1.0",
            "app.kubernetes.io/component": "control-plane",
            "app.kubernetes.io/managed-by": "Helm",
        }
    }

    budget = chart["PodDisruptionBudget"]
    assert (budget["apiVersion"], budget["spec"]) == (
        "policy/v1",
        {"minAvailable": 1, "selector": {"matchLabels": SELECTOR}},
    )
    service = chart["Service"]["spec"]
    assert (service["selector"], service["ports"]) == (SELECTOR, plain["Service"]["spec"]["ports"])


def test_the_scheduler_name_reaches_the_server(helm_env: dict[str, str]) -> None:
    pod = by_kind(render(helm_env, "--set", "schedulerName=gpu-scheduler"))["Deployment"]["spec"]["template"]["spec"]
    env = pod["containers"][0]["env"]
    assert [e for e in env if e["name"] == "GPUPOOL_SCHEDULER_NAME"] == [
        {"name": "GPUPOOL_SCHEDULER_NAME", "value": "gpu-scheduler"}
    ]


SERVICE_MONITOR = (
    "--set",
    "serviceMonitor.enabled=true,serviceMonitor.labels.release=kube-prometheus-stack,serviceMonitor.interval=1m",
)


def test_the_service_monitor_is_off_by_default_and_scrapes_metrics_with_the_token_when_on(
    helm_env: dict[str, str],
) -> None:
    assert "ServiceMonitor" not in by_kind(render(helm_env))
    docs = by_kind(render(helm_env, *SERVICE_MONITOR))
    monitor = docs["ServiceMonitor"]
    assert (monitor["apiVersion"], monitor["metadata"]["name"], monitor["metadata"]["namespace"]) == (
        "monitoring.coreos.com/v1",
        "gpupool",
        NAMESPACE,
    )
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # It selects the chart's Service (and no other) and scrapes its named port.
    assert monitor["spec"]["selector"] == {"matchLabels": SELECTOR}
    assert docs["Service"]["metadata"]["labels"].items() >= SELECTOR.items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert [p["name"] for p in docs["Service"]["spec"]["ports"]] == ["http"]
    assert monitor["spec"]["endpoints"] == [
        {
            "port": "http",
            "path": "/metrics",
            "scheme": "http",
            "interval": "1m",
            "scrapeTimeout": "10s",
            "authorization": {"type": "Bearer", "credentials": {"name": "gpupool-metrics", "key": "token"}},
        }
    ]
    # The pods serve HTTPS: so does the scrape, trusting what the values say.
    tls = render(
        helm_env, *SERVICE_MONITOR, "--set", "tls.existingSecret=tls,serviceMonitor.tlsConfig.ca.secret.name=ca"
    )
    endpoint = by_kind(tls)["ServiceMonitor"]["spec"]["endpoints"][0]
    assert (endpoint["scheme"], endpoint["tlsConfig"]) == ("https", {"ca": {"secret": {"name": "ca"}}})


def service_monitor_crd() -> dict[str, Any]:
    done = subprocess.run(
        ["go", "mod", "download", "-json", PROMETHEUS_OPERATOR],
        cwd=tempfile.gettempdir(),  # outside any Go module
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    crd: dict[str, Any] = yaml.safe_load((Path(json.loads(done.stdout)["Dir"]) / SERVICE_MONITOR_CRD).read_text())
    return crd


def test_the_service_monitor_passes_a_server_side_dry_run_against_prometheus_operators_crd(
    cluster: Cluster, helm_env: dict[str, str]
) -> None:
    namespace(cluster)
    api = cluster.api()
    extensions = client.ApiextensionsV1Api(api)
    extensions.create_custom_resource_definition(service_monitor_crd())

    def established() -> bool:
        status = extensions.read_custom_resource_definition("servicemonitors.monitoring.coreos.com").status
        return any(c.type == "Established" and c.status == "True" for c in status.conditions or [])

    poll("the ServiceMonitor CRD to be established", established, timeout=30)
    monitor = by_kind(render(helm_env, *SERVICE_MONITOR))["ServiceMonitor"]
    custom = client.CustomObjectsApi(api)
    made = custom.create_namespaced_custom_object(
        "monitoring.coreos.com", "v1", NAMESPACE, "servicemonitors", monitor, dry_run="All"
    )
    assert made["spec"]["endpoints"] == monitor["spec"]["endpoints"]  # nothing pruned: every field is the CRD's
    bad = copy.deepcopy(monitor)
    bad["spec"]["endpoints"][0]["interval"] = "every minute"
    with pytest.raises(client.ApiException) as refused:
        custom.create_namespaced_custom_object(
            "monitoring.coreos.com", "v1", NAMESPACE, "servicemonitors", bad, dry_run="All"
        )
    assert refused.value.status == 422


def namespace(cluster: Cluster) -> client.CoreV1Api:
    """The manifests' namespace (enforcing `restricted`), made once: namespaced objects need it, even in a dry run."""
    core = client.CoreV1Api(cluster.api())
    if NAMESPACE not in [n.metadata.name for n in core.list_namespace().items]:
        core.create_namespace(manifests()["Namespace"])
    return core


@pytest.mark.parametrize(
    "values",
    [(), (*MADE_SECRET, "--set", "database.password=pw,tls.existingSecret=tls,podAntiAffinity=hard")],
    ids=["defaults", "made-secret-and-tls"],
)
def test_the_rendered_objects_pass_a_server_side_dry_run(
    cluster: Cluster, helm_env: dict[str, str], values: tuple[str, ...]
) -> None:
    core = namespace(cluster)
    docs = render(helm_env, *values)
    api = cluster.api()
    for doc in docs:
        utils.create_from_dict(api, doc, dry_run="All")
    # The pods the Deployment would make, as pods: Pod Security admission holds them to `restricted` here.
    template = by_kind(docs)["Deployment"]["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {**template["metadata"], "name": "gpupool-probe"}}
    core.create_namespaced_pod(NAMESPACE, {**pod, "spec": template["spec"]}, dry_run="All")


def docs_commands() -> list[str]:
    """The console lines of the Helm section's first block in docs/kubernetes.md, continuations joined."""
    section = DOCS.read_text().split("\n## Helm\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```console\n(.*?)```", section, re.S)
    assert block is not None
    return [line[2:] for line in block.group(1).replace("\\\n", "").splitlines() if line.startswith("$ ")]


def test_the_docs_install_and_upgrade_run_as_printed(cluster: Cluster, helm_env: dict[str, str]) -> None:
    commands = docs_commands()
    assert [c.split()[:2] for c in commands] == [
        ["kubectl", "create"],
        ["kubectl", "label"],
        ["kubectl", "-n"],
        ["helm", "install"],
        ["helm", "upgrade"],
    ]
    # The kubectl lines, done through the API (the namespace, labelled; the database's Secret).
    core = namespace(cluster)
    labels = core.read_namespace(NAMESPACE).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    secret = {
        "metadata": {"name": "gpupool-db"},
        "stringData": {"url": "postgresql://gpupool@db/gpupool", "password": "pw"},
    }
    core.create_namespaced_secret(NAMESPACE, secret)
    env = {**helm_env, "KUBECONFIG": str(cluster.kubeconfig)}
    outputs = []
    for command in commands[3:]:
        done = subprocess.run(shlex.split(command), env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{command}: {done.stderr}"
        assert "PodSecurity" not in done.stderr  # no warning that the pods would break `restricted`
        outputs.append(done.stdout)
    assert "NOTES:\ngpupool 0.1.0: 2 replica(s) of gpupool in namespace gpupool-system.\n" in outputs[0]
    apps = client.AppsV1Api(cluster.api())
    deployment = apps.read_namespaced_deployment("gpupool", NAMESPACE)
    assert deployment.spec.replicas == 2
    assert deployment.spec.template.spec.containers[0].args[-2:] == ["--lease-ttl", "15"]
    budget = client.PolicyV1Api(cluster.api()).read_namespaced_pod_disruption_budget("gpupool", NAMESPACE)
    assert budget.spec.min_available == 1
    history = helm(env, "history", "gpupool", "--namespace", NAMESPACE, "--output", "yaml")
    assert [(r["revision"], r["status"]) for r in yaml.safe_load(history.stdout)] == [
        (1, "superseded"),
        (2, "deployed"),
    ]

    # The docs' refusal, word for word, from an install against the cluster.
    refused = helm(env, "install", "gpupool-bad", str(CHART), "--namespace", NAMESPACE, "--set", "replicaCount=-1")
    assert refused.returncode == 1
    assert refused.stderr.strip() in DOCS.read_text()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (("--set", "replicaCount=-1"), "- at '/replicaCount': minimum: got -1, want 0"),
        (("--set-string", "replicaCount=two"), "- at '/replicaCount': got string, want integer"),
        (("--set", "leaseTTLSeconds=1"), "- at '/leaseTTLSeconds': minimum: got 1, want 2"),
        (("--set", "replicas=3"), "- at '': additional properties 'replicas' not allowed"),
        (("--set", "podAntiAffinity=strict"), "- at '/podAntiAffinity': value must be one of 'soft', 'hard', 'none'"),
        (("--set", "schedulerName=Gpu_Pool"), "- at '/schedulerName': 'Gpu_Pool' does not match pattern"),
        (("--set", "serviceMonitor.interval=30 s"), "- at '/serviceMonitor/interval': '30 s' does not match pattern"),
        (("--set", "serviceMonitor.tokenSecret.name="), "- at '/serviceMonitor/tokenSecret/name': minLength: got 0"),
    ],
)
def test_a_bad_value_is_refused_by_the_schema(helm_env: dict[str, str], values: tuple[str, ...], message: str) -> None:
    for command in ("lint", "template"):
        done = helm(helm_env, command, *(["gpupool"] if command == "template" else []), str(CHART), *values)
        assert done.returncode == 1
        assert message in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            ("--set", "replicaCount=1"),
            "podDisruptionBudget.minAvailable (1) must be below replicaCount (1): no node holding a replica could be "
            "drained. Raise replicaCount or set podDisruptionBudget.enabled=false",
        ),
        (
            ("--set", "database.existingSecret="),
            "database: set database.existingSecret (a Secret with the store's url and password) or database.url "
            "(and database.password) for the chart to make one",
        ),
        (
            (*MADE_SECRET[:1], MADE_SECRET[1].replace("gpupool@", "gpupool:pw@"), "--set", "database.password=pw"),
            "database: database.url holds a password, which the server refuses",
        ),
    ],
    ids=["budget-blocks-drains", "no-database", "password-in-url"],
)
def test_a_combination_that_cannot_work_is_refused(
    helm_env: dict[str, str], values: tuple[str, ...], message: str
) -> None:
    done = helm(helm_env, "template", "gpupool", str(CHART), *values)
    assert done.returncode == 1
    assert message in done.stderr
