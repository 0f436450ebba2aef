"""What a pod that names gpupool asks for, its priority class and its workload's name, read from the pod alone."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpupool.backends.kubernetes.foreign import ForeignPod, foreign_pod, node_use
from gpupool.backends.kubernetes.manifests import quantity
from gpupool.control.foreign import priority_for, workload_name


def pod(containers: list[dict[str, Any]], notes: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    meta = {"uid": "0f1e2d3c-aaaa-bbbb", "namespace": "ml", "name": "train-0", "annotations": notes or {}}
    return {"metadata": meta, "spec": {"containers": containers, **spec}, "status": {"phase": "Pending"}}


def main(limits: dict[str, str] | None = None, requests: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": "main", "image": "pytorch", "resources": {"limits": limits or {}, "requests": requests or {}}}


def test_whole_gpus_cpu_and_memory_are_summed_over_containers_or_the_largest_init_container() -> None:
    p = foreign_pod(
        pod(
            [main({"nvidia.com/gpu": "2"}, {"cpu": "1500m", "memory": "4Gi"}), main(requests={"cpu": "1"})],
            initContainers=[main(requests={"cpu": "8", "memory": "1Gi"})],
            priorityClassName="high",
            terminationGracePeriodSeconds=90,
        ),
        quantity,
    )
    assert (p.gpus, p.gpu_milli, p.cpu_milli, p.memory_mib, p.grace_s) == (2, 0, 8000, 4096, 90.0)
    assert (p.image, p.priority_class, p.project, p.error) == ("pytorch", "high", None, None)


def test_fractions_by_share_or_by_memory_and_what_is_refused() -> None:
    half = foreign_pod(pod([main()], {"gpupool.io/gpu-fraction": "0.5"}), quantity)
    assert (half.gpus, half.gpu_milli, half.gpu_memory_mib, half.error) == (0, 500, 0, None)
    mem = foreign_pod(pod([main()], {"gpupool.io/gpu-memory": "20GiB"}), quantity)
    assert (mem.gpu_milli, mem.gpu_memory_mib, mem.error) == (0, 20480, None)
    assert foreign_pod(pod([main()], {"gpupool.io/gpu-fraction": "1.5"}), quantity).error == (
        "gpupool.io/gpu-fraction '1.5' is not a fraction between 0 and 1"
    )
    assert foreign_pod(pod([main()], {"gpupool.io/gpu-memory": "lots"}), quantity).error == (
        "gpupool.io/gpu-memory 'lots': expected a size like 20GiB or 512MiB"
    )
    both = pod([main({"nvidia.com/gpu": "1"})], {"gpupool.io/gpu-fraction": "0.5"})
    assert foreign_pod(both, quantity).error == (
        "ask for one of nvidia.com/gpu (whole GPUs), gpupool.io/gpu-fraction or gpupool.io/gpu-memory, not several"
    )


def test_what_a_pod_placed_by_another_scheduler_holds_until_it_ends() -> None:
    placed = pod([main({"nvidia.com/gpu": "2"}, {"cpu": "2", "memory": "512Mi"})], nodeName="gpu-000")
    use = node_use(placed, quantity)
    assert use is not None and (use.node, use.gpus, use.cpu_milli, use.memory_mib) == ("gpu-000", 2, 2000, 512)
    assert node_use({**placed, "status": {"phase": "Succeeded"}}, quantity) is None
    assert node_use(pod([main({"nvidia.com/gpu": "2"})]), quantity) is None


def _with(priority: str | None, klass: str | None) -> ForeignPod:
    p = foreign_pod(pod([main()], priorityClassName=klass) if klass else pod([main()]), quantity)
    return replace(p, priority=priority)


def test_priority_classes_map_onto_gpupools_four_and_the_label_overrides() -> None:
    names = [getattr(priority_for(_with(None, k)), "name", None) for k in (None, "batch", "system-node-critical", "x")]
    assert names == ["training", "batch", "production", "training"]
    assert getattr(priority_for(_with("interactive", "system-node-critical")), "name", None) == "interactive"
    assert priority_for(_with("urgent", None)) == "gpupool.io/priority 'urgent' names no class of gpupool's"


def test_a_workload_is_named_after_its_pod_with_its_uid_when_the_name_is_taken() -> None:
    p = _with(None, None)
    assert (workload_name(p, False), workload_name(p, True)) == ("train-0", "train-0-0f1e2d3c")
