"""The namespaces gpupool makes, one per project: labelled for Pod Security admission at the project's level, and
isolated by a NetworkPolicy (a project's pods take connections from their own namespace and the server's only)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from gpupool.backends.kubernetes.manifests import (
    MANAGED,
    PSA_ENFORCE,
    SYSTEM_NAMESPACE,
    namespace_manifest,
    network_policy_manifest,
)

log = logging.getLogger("gpupool.kubernetes")


class Namespaces:
    def __init__(self, core: Any, networking: Any, api_error: type[Exception], server_namespace: str) -> None:
        self.core = core
        self._networking = networking
        self._api_error: Any = api_error
        self.server_namespace = server_namespace
        self._levels: dict[str, str] = {}
        """Namespace → the Pod Security level its labels are known to enforce."""

    def ensure(self, ns: str, level: str) -> None:
        """Create it labelled for Pod Security Admission at `level`; one gpupool made earlier, perhaps at another
        level (an admin changed the project's), is relabelled. Namespaces gpupool did not make are left alone."""
        if self._levels.get(ns) == level:
            return
        body = namespace_manifest(ns, level)
        try:
            self.core.create_namespace(body)
        except self._api_error as e:
            if e.status != 409:
                raise
            labels = self.core.read_namespace(ns).metadata.labels or {}
            if labels.get(MANAGED) == "true" and labels.get(PSA_ENFORCE) != level:
                try:
                    self.core.patch_namespace(ns, {"metadata": {"labels": body["metadata"]["labels"]}})
                except self._api_error as e:
                    if e.status != 403:
                        raise
                    # The pods still carry their own securityContext; the label is the API server's check of it.
                    log.warning("cannot label namespace %s for pod security %s (gpupool needs patch on namespaces)",
                                ns, level)  # fmt: skip
        if ns not in self._levels and ns != SYSTEM_NAMESPACE:
            self._isolate(ns)
        self._levels[ns] = level

    def _isolate(self, ns: str) -> None:
        """The project namespace's NetworkPolicy (made once; one there already is kept as it is)."""
        policy = network_policy_manifest(ns, self.server_namespace)
        try:
            self._networking.create_namespaced_network_policy(ns, policy)
        except self._api_error as e:
            if e.status == 409:  # made before (by this server, before a restart)
                return
            if e.status != 403:
                raise
            log.warning("cannot isolate namespace %s: gpupool needs create on networkpolicies", ns)


_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def own_namespace() -> str:
    """The server's namespace where it runs in the cluster, else deploy/kubernetes's."""
    try:
        return _SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "gpupool-system"
    except OSError:
        return "gpupool-system"
