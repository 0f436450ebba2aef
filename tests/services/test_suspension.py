"""A suspended notebook's notice, as its owner reads it in `describe`, `list` and the portal: rendered from the stop's
typed arguments kept in its last attempt, the pool it ran in and the scheduler's estimate, never from a sentence."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.lifecycle import transitions as lc
from gpupool.lifecycle.phases import AllocPhase, PendingReason, Phase, StopReason
from gpupool.services.views import workload_public
from gpupool.store.tables import AllocationRow, WorkloadRow

T = 1_800_000_000.0
"""2027-01-15 08:00:00 UTC."""


def _suspended(stop: StopReason, cause: dict[str, Any], **request: Any) -> WorkloadRow:
    """A notebook placed at T - 60, stopped for `cause`, gone at T, and told by the next cycle why it waits."""
    asks = {"pools": [], "gpus": 0, "gpu_milli": 0, "gpu_memory_mib": 0, **request}
    row = WorkloadRow(
        id=3, name="nb1", type="notebook", priority_class="interactive", preemptible=True, attempt=0, nominated=[],
        allocations=[], hold=False, workers=1, created_at=T - 120, **asks,
    )  # fmt: skip
    lc.submitted(row, "ana", T - 120)
    row.allocations.append(
        AllocationRow(id="3-0-0", workload_id=3, attempt=0, member=0, node="vm", devices=[], state="bound")
    )
    lc.placed(row, ["vm"], T - 60)
    lc.move_alloc(row.allocations[0], AllocPhase.LAUNCHED)
    if stop == StopReason.IDLE:
        lc.request_stop(row, stop, T - 1, **cause)
    else:
        lc.request_stop(row, stop, T - 1, detail="the core's sentence", **cause)
    lc.move_alloc(row.allocations[0], AllocPhase.ENDED)
    lc.finish(row, T)
    if not row.hold:
        lc.waiting(row, PendingReason.NO_NODE_FITS, "no node has 1 free GPU now", (("gpus", 1), ("node", "vm")))
    return row


PREEMPTED = {"by": "train", "by_priority": "training", "by_project": "lab", "pool": "default"}


def test_a_preempted_notebook_says_who_took_its_gpus_when_and_when_it_will_be_back() -> None:
    row = _suspended(StopReason.PREEMPT, PREEMPTED, gpus=1)
    row.eta, row.eta_basis = T + 3600.4, "declared"
    w = workload_public(row, "lab", "ana")
    notice = (
        "suspended: preempted by 'train' (training) at 2027-01-15 08:00:00 UTC; resumes by itself when 1 GPU is "
        "free in pool default, ETA 2027-01-15 09:00:00 UTC"
    )
    assert (w.state, w.reason, w.reason_short) == (
        Phase.SUSPENDED, notice, "preempted by 'train' (training) at 08:00 UTC; resumes when 1 GPU is free in default",
    )  # fmt: skip
    # Programs read the cause typed, and the scheduler's own reason for what it waits on now.
    assert w.suspension is not None and w.suspension.model_dump() == {
        "reason": "preempt", "at": T, "by": "train", "by_priority": "training", "by_project": "lab",
        "pool": "default", "resumes": "automatically", "notice": notice,
    }  # fmt: skip
    assert (w.reason_event, w.reason_code, w.reason_args) == ("queued", "no-node-fits", {"gpus": 1, "node": "vm"})


@pytest.mark.parametrize(
    ("stop", "cause", "asks", "eta", "notice", "brief"),
    [
        (
            StopReason.RECLAIM, {"by_priority": "batch", "by_project": "nlp", "pool": "h100"}, {"gpu_milli": 250},
            (None, "none"),
            "suspended: reclaimed for project nlp (below its fair share) at 2027-01-15 08:00:00 UTC; resumes "
            "by itself when 0.25 of a GPU is free in pool h100, no ETA while the work holding its room runs on",
            "reclaimed for project nlp (below its fair share) at 08:00 UTC; resumes when 0.25 of a GPU is "
            "free in h100",
        ),
        (
            StopReason.CONSOLIDATE, {"by_priority": "training", "by_project": "nlp"}, {"gpus": 2, "pools": ["a", "b"]},
            (None, None),
            "suspended: moved to make room for a workload of project nlp at 2027-01-15 08:00:00 UTC; resumes by "
            "itself when 2 GPUs are free in pools a or b",
            "moved to make room for a workload of project nlp at 08:00 UTC; resumes when 2 GPUs are free in a or b",
        ),
        (
            StopReason.NODE_LOST, {"node": "vm"}, {"gpu_memory_mib": 20480}, (T + 60, "history"),
            "suspended: node vm was lost at 2027-01-15 08:00:00 UTC; resumes by itself when 20 GiB of GPU memory is "
            "free in any pool, ETA 2027-01-15 08:01:00 UTC",
            "node vm was lost at 08:00 UTC; resumes when 20 GiB of GPU memory is free in any pool",
        ),
        (
            StopReason.PREEMPT, {}, {"gpus": 1}, (None, None),
            "suspended: preempted at 2027-01-15 08:00:00 UTC; resumes by itself when 1 GPU is free in any pool",
            "preempted at 08:00 UTC; resumes when 1 GPU is free in any pool",
        ),
    ],
)  # fmt: skip
def test_each_stop_of_the_scheduler_reads_from_its_arguments(
    stop: StopReason,
    cause: dict[str, Any],
    asks: dict[str, Any],
    eta: tuple[float | None, str | None],
    notice: str,
    brief: str,
) -> None:
    row = _suspended(stop, cause, **asks)
    row.eta, row.eta_basis = eta
    w = workload_public(row, "lab")
    assert (w.reason, w.reason_short) == (notice, brief)
    assert w.suspension is not None and (w.suspension.reason, w.suspension.resumes) == (stop.value, "automatically")


def test_an_idle_notebook_keeps_its_reason_and_waits_for_resume() -> None:
    row = _suspended(StopReason.IDLE, {"idle_s": 400.0, "limit_s": 300.0}, gpus=1)
    w = workload_public(row, "lab")
    assert w.reason == "idle for 6m40s (limit 5m); resume it to start again"
    assert w.suspension is not None and (w.suspension.resumes, w.suspension.notice) == (
        "on-resume", "suspended: idle for 6m40s (limit 5m) at 2027-01-15 08:00:00 UTC; resume it to start again",
    )  # fmt: skip


def test_running_work_has_no_suspension() -> None:
    row = _suspended(StopReason.PREEMPT, PREEMPTED, gpus=1)
    row.allocations.append(
        AllocationRow(id="3-1-0", workload_id=3, attempt=1, member=0, node="vm", devices=[], state="bound")
    )
    lc.placed(row, ["vm"], T + 10)
    w = workload_public(row, "lab")
    assert (w.state, w.suspension, w.reason) == (Phase.STARTING, None, "placed on vm")
