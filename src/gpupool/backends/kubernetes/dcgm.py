"""GPU activity on Kubernetes, from NVIDIA's DCGM exporter: the DaemonSet the GPU Operator runs on every GPU node.

Its pods are found by label in their namespace (the Operator's defaults: `app=nvidia-dcgm-exporter` in
`gpu-operator`) and scraped through the API server's pod proxy, so gpupool needs no route to the pod network,
only RBAC to list those pods and get `pods/proxy` there. The exporter labels each GPU's series with the pod
(and namespace) the device plugin gave it to; that maps a GPU to a gpupool member, or, for a fractional
member, to the reservation pod holding the device for its sharers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpupool.backends.base import DeviceSample, MemberSample, Sample

log = logging.getLogger("gpupool.kubernetes")
UTIL = "DCGM_FI_DEV_GPU_UTIL"
"""GPU utilisation, percent."""
FB_USED = "DCGM_FI_DEV_FB_USED"
"""Framebuffer memory in use, MiB."""


@dataclass(frozen=True, slots=True)
class DcgmSettings:
    namespace: str = "gpu-operator"
    selector: str = "app=nvidia-dcgm-exporter"
    port_name: str = "metrics"
    """The exporter container's port by name; `port` where no port has that name."""
    port: int = 9400
    interval_s: float = 5.0
    timeout_s: float = 3.0


@dataclass(frozen=True, slots=True)
class GpuReading:
    device: DeviceSample
    """As the exporter names it (its model is DCGM's, "NVIDIA H100 80GB HBM3")."""
    pods: frozenset[tuple[str, str]]
    """(namespace, name) of the pods the exporter says hold this GPU."""


def parse(text: str, node: str) -> list[GpuReading]:
    """One exporter's page: a reading per GPU (by its `gpu` index) that reports utilisation."""
    gpus: dict[int, dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in (UTIL, FB_USED):
            continue
        for s in family.samples:
            if "gpu" not in s.labels:
                continue
            gpu = gpus.setdefault(
                int(s.labels["gpu"]),
                {"uuid": s.labels.get("UUID", ""), "model": s.labels.get("modelName", ""), "pods": set()},
            )
            gpu[family.name] = s.value
            if s.labels.get("pod"):
                gpu["pods"].add((s.labels.get("namespace", ""), s.labels["pod"]))
    out = []
    for index, g in sorted(gpus.items()):
        if UTIL in g:
            util, used = max(0, min(100, round(g[UTIL]))), int(g.get(FB_USED, 0))
            out.append(GpuReading(DeviceSample(node, index, g["uuid"], g["model"], util, used), frozenset(g["pods"])))
    return out


@dataclass(frozen=True, slots=True)
class PodIndex:
    """What the readings are mapped through, from the backend's view of its pods."""

    members: Mapping[tuple[str, str], str]
    """(namespace, pod) → allocation id, for running members."""
    reservations: Mapping[str, tuple[str, int]]
    """Reservation pod name → the (node, gpupool device index) it holds for sharers."""
    sharers: Mapping[tuple[str, int], Mapping[str, int]]
    """(node, device index) → {allocation id: milli-GPU} of the running members sharing it."""
    models: Mapping[str, str]
    """Node → the GPU model gpupool lists for it (the one its reports and metrics name)."""


def to_sample(readings: Iterable[GpuReading], index: PodIndex, reservation_namespace: str) -> Sample:
    """Per device as read; per member, the mean utilisation of its GPUs and the memory on them. Sharers of a
    device each see the device's utilisation (DCGM does not split it by process) and memory split by their
    share."""
    devices: list[DeviceSample] = []
    per_member: dict[str, list[tuple[int, float]]] = {}
    for reading in readings:
        r = reading.device
        model = index.models.get(r.node) or r.model.removeprefix("NVIDIA ").replace(" ", "-")
        devices.append(replace(r, model=model))
        for namespace, pod in sorted(reading.pods):
            alloc = index.members.get((namespace, pod))
            if alloc is not None:
                per_member.setdefault(alloc, []).append((r.util_pct, float(r.memory_used_mib)))
                continue
            held = index.reservations.get(pod) if namespace == reservation_namespace else None
            sharers = index.sharers.get(held, {}) if held is not None else {}
            total = sum(sharers.values())
            for alloc, milli in sharers.items():
                per_member.setdefault(alloc, []).append((r.util_pct, r.memory_used_mib * milli / total))
    members = {
        alloc: MemberSample(round(sum(u for u, _ in parts) / len(parts)), round(sum(m for _, m in parts)))
        for alloc, parts in per_member.items()
    }
    return Sample(members, tuple(sorted(devices, key=lambda d: (d.node, d.index))), modelled=False)


class DcgmScraper:
    """Finds the exporter pods and scrapes each through the API server every interval, in the background, so a
    scheduling cycle asking for a sample never waits on the network."""

    def __init__(self, core: Any, settings: DcgmSettings) -> None:
        self._core = core
        self.settings = settings
        self._lock = threading.Lock()
        self._latest: dict[str, tuple[float, list[GpuReading]]] = {}
        """Node → when its exporter last answered, and what it said."""
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="gpupool-dcgm")
        self._stopping = threading.Event()
        self._warned: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="gpupool-dcgm", daemon=True)
        self._thread.start()

    def readings(self) -> list[GpuReading]:
        """The latest of every exporter heard from within three intervals (a node gone quiet drops out)."""
        cutoff = time.monotonic() - 3 * self.settings.interval_s
        with self._lock:
            return [r for at, rs in self._latest.values() if at >= cutoff for r in rs]

    def close(self) -> None:
        self._stopping.set()
        self._pool.shutdown(wait=False)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.scrape()
            except Exception as e:  # no exporter this time (RBAC, the API server away): try again next interval
                self._warn_once("list", f"cannot list DCGM exporter pods in {self.settings.namespace}: {e}")
            self._stopping.wait(self.settings.interval_s)

    def scrape(self) -> None:
        s = self.settings
        pods = self._core.list_namespaced_pod(s.namespace, label_selector=s.selector).items
        targets = [
            (p.spec.node_name, p.metadata.name, self._port(p))
            for p in pods
            if p.spec.node_name and p.status is not None and p.status.phase == "Running"
        ]
        for node, readings in zip(targets, self._pool.map(self._fetch, targets), strict=True):
            if readings is not None:
                with self._lock:
                    self._latest[node[0]] = (time.monotonic(), readings)

    def _port(self, pod: Any) -> int:
        for c in pod.spec.containers or []:
            for p in c.ports or []:
                if p.name == self.settings.port_name:
                    return int(p.container_port)
        return self.settings.port

    def _fetch(self, target: tuple[str, str, int]) -> list[GpuReading] | None:
        node, pod, port = target
        try:
            response = self._core.connect_get_namespaced_pod_proxy_with_path(
                f"{pod}:{port}", self.settings.namespace, "metrics",
                _preload_content=False, _request_timeout=self.settings.timeout_s,
            )  # fmt: skip
            return parse(response.data.decode("utf-8", errors="replace"), node)
        except Exception as e:  # one exporter down or answering nonsense costs only its node's sample
            self._warn_once(pod, f"DCGM exporter {self.settings.namespace}/{pod} on {node}: {e}")
            return None

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", message)
