"""The kubernetes backend's pure half: nodes read from Node objects, pods written from launch specs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpupool.backends.base import DeviceGrant, LaunchSpec
from gpupool.backends.kubernetes.manifests import (
    GPU,
    SCHEDULER,
    namespace_manifest,
    node_from,
    pod_manifest,
    pod_name,
    reservation_manifest,
)
from gpupool.control.mlflow_runs import serving


def _node(**over: object) -> dict[str, object]:
    obj: dict[str, object] = {
        "metadata": {
            "name": "gpu-1",
            "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559",
                       "gpupool.io/pool": "h100"},
        },
        "spec": {},
        "status": {"allocatable": {"cpu": "96", "memory": "1Ti", GPU: "8"}},
    }  # fmt: skip
    obj.update(over)
    return obj


def test_a_gpu_node_is_read_from_its_labels_and_allocatable() -> None:
    n = node_from(_node(), "gpupool.io/pool", not_ready=False)
    assert n is not None
    assert (n.name, n.pool, n.cpu_milli, n.memory_mib, len(n.devices)) == ("gpu-1", "h100", 96_000, 1024 * 1024, 8)
    assert n.devices[0].model == "H100-80GB-HBM3" and n.devices[0].memory_mib == 81559 and n.schedulable
    assert not node_from(_node(), "gpupool.io/pool", not_ready=True).schedulable  # type: ignore[union-attr]
    cordoned = _node(spec={"unschedulable": True})
    assert not node_from(cordoned, "gpupool.io/pool", not_ready=False).schedulable  # type: ignore[union-attr]
    tainted = _node(spec={"taints": [{"key": "maintenance", "effect": "NoSchedule"}]})
    assert not node_from(tainted, "gpupool.io/pool", not_ready=False).schedulable  # type: ignore[union-attr]
    gpu_only = _node(spec={"taints": [{"key": GPU, "effect": "NoSchedule"}]})
    assert node_from(gpu_only, "gpupool.io/pool", not_ready=False).schedulable  # type: ignore[union-attr]


def _spec(**over: object) -> LaunchSpec:
    base: dict[str, object] = {
        "alloc_id": "17-0-1", "workload_id": 17, "workload_name": "Train_ResNet", "project": "vision",
        "kind": "training", "argv": ("python", "train.py"), "env": {"EPOCHS": "3"}, "node": "gpu-1",
    }  # fmt: skip
    base.update(over)
    return LaunchSpec(**base)  # type: ignore[arg-type]


def test_pods_are_bound_by_gpupool_with_deterministic_dns_safe_names() -> None:
    whole = _spec(devices=(DeviceGrant(2, 1000, 81559, "H100", 81559), DeviceGrant(3, 1000, 81559, "H100", 81559)))
    pod = pod_manifest(whole, "gpupool-vision", "img:1")
    assert pod["metadata"]["name"] == pod_name(whole) == "train-resnet-17-0-1"
    assert pod["spec"]["nodeName"] == "gpu-1" and pod["spec"]["schedulerName"] == SCHEDULER
    main = pod["spec"]["containers"][0]
    assert main["resources"]["limits"] == {GPU: "2"} and main["command"] == ["python", "train.py"]
    assert {"name": "EPOCHS", "value": "3"} in main["env"]
    assert pod["metadata"]["annotations"]["gpupool.io/allocation"] == "17-0-1"
    long = _spec(workload_name="x" * 80)
    assert len(pod_name(long)) <= 63 and pod_name(long) == pod_name(long)


def test_fractions_name_their_reserved_device_and_gangs_get_torchrun_variables() -> None:
    frac = pod_manifest(_spec(devices=(DeviceGrant(5, 250, 20389, "H100", 81559),)), "ns", "img")
    env = {e["name"]: e["value"] for e in frac["spec"]["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-gpu-1-5" and env["GPUPOOL_GPU_FRACTION"] == "0.250"
    assert GPU not in frac["spec"]["containers"][0]["resources"]["limits"]  # the reservation holds the device
    hold = reservation_manifest("gpu-1", 5, "img")
    assert hold["spec"]["nodeName"] == "gpu-1" and hold["spec"]["containers"][0]["resources"]["limits"] == {GPU: "1"}
    gang = pod_manifest(_spec(world_size=2, rank=1, master_port=29500), "gpupool-vision", "img")
    genv = {e["name"]: e["value"] for e in gang["spec"]["containers"][0]["env"]}
    assert genv["MASTER_ADDR"] == "rank-0.train-resnet-17-0.gpupool-vision.svc"
    assert (genv["RANK"], genv["WORLD_SIZE"]) == ("1", "2")
    assert gang["spec"]["hostname"] == "rank-1" and gang["spec"]["subdomain"] == "train-resnet-17-0"


RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": False,
}


def _confinement(pod: dict[str, object]) -> dict[str, object]:
    spec = pod["spec"]
    assert isinstance(spec, dict)
    keys = ("securityContext", "automountServiceAccountToken", "hostNetwork", "hostPID", "hostIPC", "volumes")
    return {k: spec.get(k) for k in keys} | {"container": spec["containers"][0]["securityContext"]}


def test_pods_are_restricted_by_default_and_run_as_their_projects_own_non_root_identity() -> None:
    pod = pod_manifest(_spec(project_id=7), "gpupool-vision", "img")
    uid = 1_900_000_007
    assert _confinement(pod) == {
        "securityContext": {
            "runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "automountServiceAccountToken": False, "hostNetwork": False, "hostPID": False, "hostIPC": False,
        "volumes": None, "container": RESTRICTED_CONTAINER,
    }  # fmt: skip
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["HOME"] == "/tmp"  # its uid has no passwd entry in the image: HOME would be an unwritable "/"
    other = pod_manifest(_spec(project_id=8, env={"HOME": "/work"}), "gpupool-nlp", "img", uid_base=5_000_000)
    assert other["spec"]["securityContext"]["runAsUser"] == 5_000_008
    assert {"name": "HOME", "value": "/work"} in other["spec"]["containers"][0]["env"]


def test_a_baseline_pod_runs_as_its_images_user_but_keeps_seccomp_and_no_privilege() -> None:
    pod = pod_manifest(_spec(project_id=7, pod_security="baseline"), "gpupool-vision", "img")
    assert _confinement(pod) == {
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "automountServiceAccountToken": False, "hostNetwork": False, "hostPID": False, "hostIPC": False,
        "volumes": None, "container": {"allowPrivilegeEscalation": False, "privileged": False},
    }  # fmt: skip
    assert "HOME" not in {e["name"] for e in pod["spec"]["containers"][0]["env"]}


def test_an_unknown_pod_security_level_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^pod security 'privileged': expected one of restricted, baseline$"):
        pod_manifest(_spec(pod_security="privileged"), "gpupool-vision", "img")


def test_namespaces_carry_the_pod_security_admission_labels_of_their_level() -> None:
    assert namespace_manifest("gpupool-vision", "restricted") == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": "gpupool-vision",
            "labels": {
                "gpupool.io/managed": "true",
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            },
        },
    }
    labels = namespace_manifest("gpupool-nlp", "baseline")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"


def test_reservation_pods_are_restricted_and_run_as_nobody() -> None:
    hold = reservation_manifest("gpu-1", 5, "img")
    assert _confinement(hold) == {
        "securityContext": {
            "runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534, "fsGroup": 65534,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "automountServiceAccountToken": False, "hostNetwork": False, "hostPID": False, "hostIPC": False,
        "volumes": None, "container": RESTRICTED_CONTAINER,
    }  # fmt: skip


def test_an_init_command_runs_to_its_end_before_the_command_in_a_working_directory_of_its_own(
    tmp_path: Path,
) -> None:
    init, argv = serving("/opt/mlflow/bin/mlflow", "models:/doubler/1")
    pod = pod_manifest(_spec(kind="inference", argv=argv, init=init, port=8080), "gpupool-vision", "img:1")
    main = pod["spec"]["containers"][0]
    assert main["command"][:2] == ["/bin/sh", "-c"] and main["command"][3:] == ["gpupool-init", *argv]
    assert main["workingDir"] == "/workspace" and main["volumeMounts"] == [{"name": "code", "mountPath": "/workspace"}]
    assert pod["spec"]["volumes"] == [{"name": "code", "emptyDir": {}}]

    # What that shell runs: the init (its words kept whole), then the command, only if the init succeeded.
    def run(init: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
        shell = pod_manifest(_spec(argv=("sh", "-c", 'cat "$0"', "made"), init=init), "ns", "img")
        command = shell["spec"]["containers"][0]["command"]
        return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, check=False)

    done = run(("sh", "-c", 'printf "%s" "$0" > made', "it's ready"))
    assert (done.returncode, done.stdout) == (0, "it's ready")
    failed = run(("sh", "-c", "rm -f made; exit 3"))
    assert (failed.returncode, failed.stdout) == (3, "")
