"""A pod of a workload with code fetches it in an init step, as the main container's own restricted identity,
into an emptyDir the main container starts in; a pod without code is as before (no volume at all)."""

from __future__ import annotations

from gpupool.backends.base import LaunchSpec
from gpupool.backends.kubernetes.manifests import CodeFetch, pod_manifest

SPEC = LaunchSpec("7-0-0", 7, "train", "vision", "training", ("python", "train.py"), {}, node="n1", project_id=3)
FETCH = CodeFetch("https://gpupool.example:8470", "gpc_7_" + "a" * 64, "registry.example/gpupool:1")


def test_the_init_step_fetches_the_code_into_the_directory_the_job_starts_in() -> None:
    pod = pod_manifest(SPEC, "gpupool-vision", "busybox", code=FETCH)["spec"]
    main = pod["containers"][0]
    assert pod["volumes"] == [{"name": "code", "emptyDir": {}}]
    assert pod["initContainers"] == [
        {
            "name": "code",
            "image": "registry.example/gpupool:1",
            "command": ["python", "-m", "gpupool.client.code", "--into", "/workspace"],
            "env": [
                {"name": "GPUPOOL_CODE_TOKEN", "value": "gpc_7_" + "a" * 64},
                {"name": "GPUPOOL_URL", "value": "https://gpupool.example:8470"},
                {"name": "GPUPOOL_WORKLOAD_ID", "value": "7"},
            ],
            "volumeMounts": [{"name": "code", "mountPath": "/workspace"}],
            "securityContext": main["securityContext"],
        }
    ]
    assert (main["workingDir"], main["volumeMounts"]) == ("/workspace", [{"name": "code", "mountPath": "/workspace"}])
    assert pod["securityContext"]["runAsUser"] == 1_900_000_003  # the init step writes as the job's own uid


def test_a_pod_without_code_has_no_volume_and_no_init_step() -> None:
    pod = pod_manifest(SPEC, "gpupool-vision", "busybox")["spec"]
    assert ("volumes" in pod, "initContainers" in pod, "workingDir" in pod["containers"][0]) == (False, False, False)
