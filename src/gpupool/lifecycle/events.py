"""What happened to a workload, as a code and its arguments; the text people read is rendered from them here, at
the edge (API views, CLI, portal), and never parsed back."""

from __future__ import annotations

import signal
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from gpupool.durations import format_duration
from gpupool.lifecycle.phases import REQUEUES, Offboarding, StopReason


class EventCode(StrEnum):
    SUBMITTED = "submitted"
    """args: by."""
    QUEUED = "queued"
    """Not an event of its own: a queued workload's current reason (the scheduler's, args: detail)."""
    PLACED = "placed"
    """args: nodes."""
    RUNNING = "running"
    SERVING = "serving"
    """A notebook or service answers on its port."""
    STOP_REQUESTED = "stop-requested"
    """Its members are asked to stop; the event's reason is the StopReason. args by reason: detail (scheduler),
    by (cancel), idle_s/limit_s (idle), ran_s/limit_s (max-runtime), member/exit_code (failed), node (node-lost)."""
    REQUEUED = "requeued"
    """Back in the queue after a stop it did not cause; args: those of the stop."""
    RETRYING = "retrying"
    """An attempt ended in a way its retry policy retries: the same workload waits out a backoff, then is queued
    again as its next attempt; the event's reason is the StopReason. args: attempt (the next one, from 1), retry
    (its number, from 1), max_retries, backoff_s, and those of the stop (member/exit_code for a failure)."""
    SUSPENDED = "suspended"
    """A notebook stopped by a policy (held until resumed) or by the scheduler (queued again at once: it resumes by
    itself); the event's reason is the StopReason; args: those of the stop (a scheduler's: detail, and by,
    by_priority, by_project, pool where known, gpupool.control.causes)."""
    RESUMED = "resumed"
    """args: by."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    """args: member/exit_code (a member failed), or those of a policy stop (reason idle or max-runtime); with
    `retries`, the attempts its retry policy allowed were all used (the reason is the last one's stop)."""
    CANCELLED = "cancelled"
    """args: by."""
    NOTE = "note"
    """An event written before events had codes; args: text."""


def duration(seconds: float) -> str:
    return format_duration(seconds)


def _exit(code: Any) -> str:
    """ "code 1"; a shell's 128+N, for a process that signal N ended, names the signal ("code 137 (SIGKILL)"), and
    an abort says what aborts most often at exit on a GPU cluster."""
    if code is None:
        return "an unknown status (killed or lost)"
    if isinstance(code, int) and 128 < code < 128 + 65:
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            return f"code {code}"
        return f"code {code} ({name}{_ABORTED if name == 'SIGABRT' else ''})"
    return f"code {code}"


_ABORTED = (": it aborted; a PyTorch script that leaves its process group open can, at exit: call "
            "dist.destroy_process_group() before it returns")  # fmt: skip


_OFFBOARDED = {
    Offboarding.REMOVED: "was removed from project {project}",
    Offboarding.DISABLED: "was disabled",
    Offboarding.DELETED: "was deleted",
}


def cancelled(args: Mapping[str, Any]) -> str:
    """"cancelled by admin", and why where its owner did not ask: "…: its owner ana was removed from project nlp"."""
    said = f"cancelled by {args.get('by', '?')}"
    try:
        why = Offboarding(str(args.get("offboarded")))
    except ValueError:
        return said
    return f"{said}: its owner {args.get('owner', '?')} " + _OFFBOARDED[why].format(project=args.get("project", "?"))


def stop_cause(reason: str | None, args: Mapping[str, Any]) -> str:
    """Why a workload was stopped, in a few words: "idle for 5m (limit 5m)", "reclaim: …"."""
    if "text" in args:  # written as a sentence before events had codes
        return str(args["text"])
    if reason == StopReason.CANCEL:
        return cancelled(args)
    if reason == StopReason.IDLE:
        return f"idle for {duration(args.get('idle_s', 0))} (limit {duration(args.get('limit_s', 0))})"
    if reason == StopReason.MAX_RUNTIME:
        bound = "its max duration" if args.get("declared") else "limit"
        return f"ran for {duration(args.get('ran_s', 0))} ({bound} {duration(args.get('limit_s', 0))})"
    if reason == StopReason.MEMBER_FAILED:
        said = f": {args['detail']}" if args.get("detail") else ""
        return f"member {args.get('member', '?')} exited with {_exit(args.get('exit_code'))}{said}"
    if reason == StopReason.NODE_LOST:
        return f"node {args.get('node', '?')} was lost"
    if reason == StopReason.CLUSTER_LOST:
        return f"cluster {args.get('cluster', '?')} was down for {duration(args.get('down_s', 0))}; requeued elsewhere"
    if reason == StopReason.BURST_BUDGET:
        return f"department {args.get('department', '?')} reached its burst budget"
    if "detail" in args:
        return f"{reason}: {args['detail']}"
    return str(args.get("text", reason or "stopped"))


def render(code: str | None, reason: str | None, args: Mapping[str, Any] | None) -> str:
    """The sentence for an event, or for a workload's current reason (the code and arguments of its last step)."""
    a: Mapping[str, Any] = args or {}
    match code:
        case EventCode.SUBMITTED:
            return f"submitted by {a.get('by', '?')}"
        case EventCode.QUEUED:
            return str(a.get("detail", "waiting for the scheduler"))
        case EventCode.PLACED:
            return f"placed on {', '.join(a.get('nodes', []))}"
        case EventCode.RUNNING:
            return "running"
        case EventCode.SERVING:
            return "answering on its port"
        case EventCode.STOP_REQUESTED:
            return f"{stop_cause(reason, a)}; stopping"
        case EventCode.REQUEUED:
            return f"requeued after {stop_cause(reason, a)}"
        case EventCode.RETRYING:
            cause = stop_cause(reason, a)
            retry = f"retry {a.get('retry', '?')} of {a.get('max_retries', '?')}"
            return f"{cause}; {retry} (attempt {a.get('attempt', '?')}) in {duration(a.get('backoff_s', 0))}"
        case EventCode.SUSPENDED:
            if reason in REQUEUES:
                return f"suspended after {stop_cause(reason, a)}; it resumes by itself when there is room"
            return f"{stop_cause(reason, a)}; resume it to start again"
        case EventCode.RESUMED:
            return f"resumed by {a.get('by', '?')}"
        case EventCode.SUCCEEDED:
            return "every member exited with code 0"
        case EventCode.FAILED:
            if "retries" in a:
                return f"{stop_cause(reason, a)}; no retries left (it had {a['retries']})"
            if reason in (StopReason.IDLE, StopReason.MAX_RUNTIME):
                return f"stopped by policy: {stop_cause(reason, a)}"
            return stop_cause(StopReason.MEMBER_FAILED, a) if "member" in a else "failed"
        case EventCode.CANCELLED:
            return cancelled(a)
    return str(a.get("text", code or ""))
