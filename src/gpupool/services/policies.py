"""Idle and runtime policies of departments and projects."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.control.policies import chains, effective
from gpupool.models.schemas import PolicyPublic, PolicyUpdate
from gpupool.services import audit
from gpupool.services.auth import Principal
from gpupool.services.errors import Forbidden, Invalid
from gpupool.services.org import visible_queue
from gpupool.store.tables import QueueRow


def _public(session: Session, row: QueueRow) -> PolicyPublic:
    chain = chains(list(session.scalars(select(QueueRow))))[row.id]
    pol = effective(chain)
    return PolicyPublic(
        queue=row.name,
        own=dict(row.policy or {}),
        idle_timeout_s=pol.idle_timeout_s,
        max_runtime_s=pol.max_runtime_s,
        idle_threshold_pct=pol.idle_threshold_pct,
        source=pol.source,
    )


def get_policy(session: Session, who: Principal, name: str) -> PolicyPublic:
    return _public(session, visible_queue(session, who, name))


def update_policy(session: Session, who: Principal, name: str, body: PolicyUpdate) -> PolicyPublic:
    """Merge the change into the queue's own policy. Refused if it would loosen what an ancestor sets. Admins set
    any; a department admin its projects' (which may only tighten the department's)."""
    row = visible_queue(session, who, name)
    audit.note(tenant=name, obj=f"policy/{name}")
    if not (who.is_admin or (row.kind == "project" and who.manages_project(row.id))):
        raise Forbidden(f"your role ({who.role}) cannot change the policy of {name!r}")
    own: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in (row.policy or {}).items()}
    for key, changes in (("idle_timeout", body.idle_timeout_s), ("max_runtime", body.max_runtime_s)):
        limits = dict(own.get(key) or {})
        for kind, seconds in changes.items():
            if seconds is None:
                limits.pop(kind, None)
            elif seconds <= 0:
                raise Invalid(f"{key} for {kind} must be positive (or null to remove it)")
            else:
                limits[kind] = seconds
        own[key] = limits
    if body.idle_threshold_pct is not None:
        own["idle_threshold_pct"] = body.idle_threshold_pct
    queues = list(session.scalars(select(QueueRow)))
    parent_chain = chains(queues)[row.id][1:]
    inherited = effective(parent_chain)
    for kind, seconds in (own.get("idle_timeout") or {}).items():
        limit = inherited.idle_timeout_s.get(kind)
        if limit is not None and seconds > limit:
            raise Invalid(
                f"{name!r} may only tighten: {kind} idle timeout {seconds:g}s is looser than {limit:g}s above it"
            )
    for kind, seconds in (own.get("max_runtime") or {}).items():
        limit = inherited.max_runtime_s.get(kind)
        if limit is not None and seconds > limit:
            raise Invalid(
                f"{name!r} may only tighten: {kind} max runtime {seconds:g}s is looser than {limit:g}s above it"
            )
    threshold = own.get("idle_threshold_pct")
    if threshold is not None and parent_chain and threshold < inherited.idle_threshold_pct:
        raise Invalid(
            f"{name!r} may only tighten: idle threshold {threshold}% is below {inherited.idle_threshold_pct}%"
        )
    row.policy = own
    session.commit()
    return _public(session, row)
