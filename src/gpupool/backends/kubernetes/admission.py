"""Jobs and JobSets that wait for gpupool's admission, as Kueue's do: created suspended with the `gpupool.io/project`
label, they make no pod until gpupool unsuspends them, which it does once their whole gang has a place within their
quota (gpupool.control.admission). The backend lists them, reads their gang from their pod templates, and suspends
or unsuspends them as the store says."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from gpupool.backends.kubernetes.foreign import PROJECT, ForeignPod, event, foreign_pod
from gpupool.backends.kubernetes.gangs import asks_gpu, job_size, jobset_size
from gpupool.backends.kubernetes.manifests import quantity

log = logging.getLogger("gpupool.kubernetes")
JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
LIST_EVERY_S = 2.0


@dataclass(frozen=True, slots=True)
class Suspendable:
    """A Job or JobSet labelled with a gpupool project: what its gang asks, from its pod templates."""

    kind: str
    api_version: str
    namespace: str
    name: str
    uid: str
    project: str
    suspended: bool
    finished: bool
    size: int
    """Its pods that ask for GPUs, all at once."""
    members: tuple[ForeignPod, ...]
    """A pod as each of its templates that ask for GPUs makes it (requests, priority, grace), under its project:
    gpupool.control.pod_rules.gang_request decides whether they make one gang."""
    error: str | None = None


def _template_pod(obj: Mapping[str, Any], name: str, template: Mapping[str, Any]) -> ForeignPod:
    meta = obj.get("metadata") or {}
    tmeta = template.get("metadata") or {}
    pod = {
        "metadata": {"uid": meta.get("uid", ""), "namespace": meta.get("namespace", ""), "name": name,
                     "labels": tmeta.get("labels") or {}, "annotations": tmeta.get("annotations") or {}},
        "spec": template.get("spec") or {},
    }  # fmt: skip
    project = (meta.get("labels") or {}).get(PROJECT) or None
    return replace(foreign_pod(pod, quantity), project=project)


def _finished(obj: Mapping[str, Any]) -> bool:
    conds = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") in ("Complete", "Failed", "Completed") and c.get("status") == "True" for c in conds)


def suspendable(obj: Mapping[str, Any], kind: str, scheduler: str) -> Suspendable | None:
    """A labelled Job (one no other object controls: a JobSet's own Jobs are admitted with it) or JobSet."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    if kind == "Job" and any(r.get("controller") for r in meta.get("ownerReferences") or []):
        return None
    name = str(meta.get("name", ""))
    if kind == "Job":
        templates = {name: spec.get("template") or {}}
        size = job_size(obj)
    else:
        templates = {f"{name}-{rj.get('name', '')}": ((rj.get("template") or {}).get("spec") or {}).get("template")
                     or {} for rj in spec.get("replicatedJobs") or []}  # fmt: skip
        size = jobset_size(obj)
    members = tuple(_template_pod(obj, n, t) for n, t in templates.items() if asks_gpu(t))
    error = None
    if any((t.get("spec") or {}).get("schedulerName") != scheduler for t in templates.values()):
        error = f"its pods do not name gpupool's scheduler (schedulerName: {scheduler})"
    elif not members:
        error = "its pods ask for no GPU: gpupool admits the Jobs whose pods ask for GPUs"
    else:
        error = next((m.error for m in members if m.error), None)
    return Suspendable(
        kind=kind,
        api_version=str(obj.get("apiVersion", "batch/v1" if kind == "Job" else "jobset.x-k8s.io/v1alpha2")),
        namespace=str(meta.get("namespace", "")),
        name=name,
        uid=str(meta.get("uid", "")),
        project=str((meta.get("labels") or {}).get(PROJECT, "")),
        suspended=bool(spec.get("suspend")),
        finished=_finished(obj),
        size=size,
        members=members,
        error=error,
    )


class Admitter:
    """Lists the labelled Jobs and JobSets (every LIST_EVERY_S at most) and suspends or unsuspends them."""

    def __init__(self, api_client: Any, client: Any, scheduler: str, component: str) -> None:
        self._client = client
        self._batch = client.BatchV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)
        self.scheduler = scheduler
        self.component = component
        self._listed: tuple[float, list[Suspendable]] | None = None
        self._jobsets = True
        """Whether JobSets are served (their CRD installed); looked for again at each list."""

    def objects(self) -> list[Suspendable] | None:
        """The labelled Jobs and JobSets; None when they could not be listed (nothing is concluded then)."""
        now = time.monotonic()
        if self._listed is not None and now - self._listed[0] < LIST_EVERY_S:
            return self._listed[1]
        try:
            raw = self._batch.list_job_for_all_namespaces(label_selector=PROJECT, _preload_content=False)
            found = [suspendable(j, "Job", self.scheduler) for j in json.loads(raw.data).get("items") or []]
            try:
                sets = self._custom.list_cluster_custom_object(*JOBSET, label_selector=PROJECT).get("items") or []
            except self._client.ApiException as e:
                if e.status != 404:
                    raise
                sets = []  # JobSets are not served here
            found += [suspendable(js, "JobSet", self.scheduler) for js in sets]
        except Exception as e:  # an API error or a dropped connection: looked at again next time
            log.warning("listing the Jobs and JobSets that wait for admission failed: %s", e)
            return None
        out = sorted((f for f in found if f is not None), key=lambda f: f.uid)
        self._listed = (now, out)
        return out

    def suspend(self, obj: Suspendable, suspended: bool) -> None:
        """Suspend or unsuspend it (idempotent: what is already so is not written)."""
        body = {"spec": {"suspend": suspended}}
        try:
            if obj.kind == "Job":
                self._batch.patch_namespaced_job(obj.name, obj.namespace, body)
            else:
                self._custom.patch_namespaced_custom_object(*JOBSET[:2], obj.namespace, JOBSET[2], obj.name, body)
        except self._client.ApiException as e:
            if e.status != 404:
                raise
        self._listed = None  # read again: what was listed is out of date

    def tell(self, obj: Suspendable, reason: str, message: str, warning: bool) -> None:
        """An Event on the Job or JobSet: why it is not admitted, or that it is."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        involved = {"apiVersion": obj.api_version, "kind": obj.kind, "namespace": obj.namespace, "name": obj.name,
                    "uid": obj.uid}  # fmt: skip
        body = event(involved, reason, message, warning, now, f"{time.time_ns():x}", self.component)
        try:
            self._core.create_namespaced_event(obj.namespace, body)
        except self._client.ApiException as e:
            log.warning("an event on %s %s/%s failed: %s", obj.kind, obj.namespace, obj.name, e.reason)
