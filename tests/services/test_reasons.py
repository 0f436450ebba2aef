"""The one renderer of scheduler reasons: each code's sentence and short form from its arguments (the core's
integer units shown as GPUs, CPUs and GiB), and the core's own sentence where the arguments do not say enough."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.core.decision import PendingCode
from gpupool.lifecycle.phases import PendingReason
from gpupool.services.reasons import gib, gpus, sentence, short

QUOTA = {"queue": "vision", "level": "project", "pool": "h100", "resource": "gpu", "used": 6000, "quota": 8000}

CASES: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "over-limit",
        {**QUOTA, "asks": 4000},
        "would put project vision over its limit in pool h100: uses 6 of 8 GPUs, asks 4 (2 over)",
        "over limit: vision 6+4/8 GPUs in h100",
    ),
    (
        "over-limit",
        {
            **QUOTA,
            "level": "department",
            "queue": "research",
            "resource": "cpu",
            "used": 12000,
            "quota": 16000,
            "asks": 8000,
        },
        "would put department research over its limit in pool h100: uses 12 of 16 CPUs, asks 8 (4 over)",
        "over limit: research 12+8/16 CPUs in h100",
    ),
    (
        "nonpreemptible-over-deserved",
        {**QUOTA, "resource": "memory", "used": 40960, "quota": 65536, "asks": 32768},
        "not preemptible, so it must fit in the deserved quota of project vision in pool h100: non-preemptible "
        "work uses 40 of 64 GiB of memory, asks 32 (8 over)",
        "over deserved (not preemptible): vision 40+32/64 GiB in h100",
    ),
    (
        "over-deserved",
        {**QUOTA, "used": 3000, "quota": 2000, "fair": 2500, "asks": 1000},
        "would take project vision past its deserved quota in pool h100: uses 3 GPUs, deserves 2 (fair share 2.5), "
        "asks 1; beyond it, preemptible work only borrows idle GPUs, and none are idle for it",
        "over deserved: vision 3+1/2 GPUs in h100",
    ),
    # One GPU, or a part of one, is singular wherever an amount is followed by its unit (the README's quick start
    # showed "uses 1 GPUs"); the short forms are ratios and keep the plural.
    (
        "over-deserved",
        {**QUOTA, "used": 1000, "quota": 1000, "asks": 500},
        "would take project vision past its deserved quota in pool h100: uses 1 GPU, deserves 1, asks 0.5; beyond "
        "it, preemptible work only borrows idle GPUs, and none are idle for it",
        "over deserved: vision 1+0.5/1 GPUs in h100",
    ),
    (
        "over-limit",
        {**QUOTA, "used": 500, "quota": 1000, "asks": 1000},
        "would put project vision over its limit in pool h100: uses 0.5 of 1 GPU, asks 1 (0.5 over)",
        "over limit: vision 0.5+1/1 GPUs in h100",
    ),
    (
        "over-limit",
        {**QUOTA, "resource": "cpu", "used": 1000, "quota": 1000, "asks": 2000},
        "would put project vision over its limit in pool h100: uses 1 of 1 CPU, asks 2 (2 over)",
        "over limit: vision 1+2/1 CPUs in h100",
    ),
    (
        "waiting-for-evictions",
        {"victims": 1, "gpu_milli": 1000, "borrowers": "nlp", "nodes": ""},
        "waiting for 1 evicted workload of project nlp to release 1 GPU",
        "waiting for 1 eviction",
    ),
    (
        "no-node-fits",
        {"members": 1, "gpus": 2, "cpu_milli": 4000, "node": "node-007", "lacks_gpus": 1, "lacks_cpu_milli": 2500},
        "no node has 2 free GPUs and 4 CPUs now; the closest node, node-007, lacks 1 free GPU and 2.5 CPUs",
        "no node fits (closest node-007)",
    ),
    (
        "no-node-fits",
        {
            "members": 1,
            "gpu_memory_mib": 20480,
            "memory_mib": 8192,
            "node": "n1",
            "lacks_gpu_memory_mib": 4096,
            "lacks_memory_mib": 1536,
        },
        "no node has a device with 20 GiB of GPU memory free and 8 GiB of memory now; the closest node, n1, lacks "
        "4 GiB of GPU memory and 1.5 GiB of memory",
        "no node fits (closest n1)",
    ),
    (
        "gang-unplaceable",
        {"members": 4, "gpus": 8, "node": "node-003", "lacks_gpus": 3, "fits": 2},
        "gang of 4 members, each needing 8 free GPUs, cannot be placed whole: 2 of them fit now; the closest node "
        "for one more member, node-003, lacks 3 free GPUs",
        "gang of 4 does not fit whole (2 fit)",
    ),
    (
        "never-fits",
        {"members": 2, "gpus": 16},
        "no node could host 2 members with 16 free GPUs each, even empty",
        "never fits",
    ),
    (
        "no-shareable-device",
        {"members": 1, "gpu_milli": 500, "pool": "shared"},
        "it fits only on devices that other projects' shares hold, and pool shared does not share a device across "
        "projects",
        "no shareable device in shared",
    ),
    (
        "waiting-for-evictions",
        {"victims": 3, "gpu_milli": 4000, "borrowers": "nlp,speech", "nodes": "node-1,node-2"},
        "waiting for 3 evicted workloads of projects nlp, speech to release 4 GPUs; it will start on node-1, node-2",
        "waiting for 3 evictions",
    ),
    (
        "waiting-for-evictions",
        {"victims": 1, "gpu_milli": 500, "borrowers": "", "nodes": "node-1"},
        "waiting for 1 evicted workload to release 0.5 GPU; it will start on node-1",
        "waiting for 1 eviction",
    ),
    (
        "min-runtime",
        {"until": 1_780_000_000, "victim": "train-7", "project": "nlp", "gpu_milli": 4000},
        "waiting for train-7 of project nlp to pass its minimum runtime at 2026-05-28 20:26:40 UTC; then its 4 GPUs "
        "may be taken",
        "min runtime of train-7 until 20:26 UTC",
    ),
    (
        "min-runtime",
        {"until": 1_780_000_000, "project": "nlp", "gpu_milli": 500},  # another project's: not named
        "waiting for a workload of project nlp to pass its minimum runtime at 2026-05-28 20:26:40 UTC; then its "
        "0.5 GPU may be taken",
        "min runtime of nlp until 20:26 UTC",
    ),
    (
        "queued-behind",
        {"ahead": 3, "project": "vision", "blocker": "no-node-fits", "members": 1, "gpus": 2},
        "queued behind 3 higher-priority workloads of project vision; no node has 2 free GPUs now",
        "behind 3; no node fits",
    ),
    (
        "queued-behind",
        {"ahead": 1, "project": "vision", "blocker": "over-deserved", **QUOTA, "quota": 6000, "asks": 1000},
        "queued behind 1 higher-priority workload of project vision; would take project vision past its deserved "
        "quota in pool h100: uses 6 GPUs, deserves 6, asks 1; beyond it, preemptible work only borrows idle GPUs, "
        "and none are idle for it",
        "behind 1; over deserved: vision 6+1/6 GPUs in h100",
    ),
]


@pytest.mark.parametrize(("code", "args", "text", "brief"), CASES)
def test_each_code_reads_from_its_arguments(code: str, args: dict[str, Any], text: str, brief: str) -> None:
    assert sentence(code, args, "the core's sentence") == text
    assert short(code, args) == brief


def test_every_scheduler_code_has_a_sentence_and_a_short_form() -> None:
    rendered = {c for c, *_ in CASES}
    assert rendered == {c.value for c in PendingCode}
    assert rendered < {r.value for r in PendingReason}


def test_a_reason_without_its_numbers_shows_the_cores_sentence() -> None:
    # Rows written before the arguments existed keep only the sentence; a strict-FIFO wait has no numbers.
    assert sentence("over-limit", {}, "vision would exceed its limit of 8 GPUs") == (
        "vision would exceed its limit of 8 GPUs"
    )
    assert sentence("over-limit", {"queue": "vision"}, "the core's") == "the core's"
    assert short("over-limit", {"queue": "vision"}) == "over limit"
    assert sentence("waiting", {}, None) == "waiting for the scheduler"
    assert short(None, {}) == "waiting for the scheduler"


def test_units_are_short_decimals() -> None:
    assert [gpus(m) for m in (0, 250, 1000, 1500, 6000, 333)] == ["0", "0.25", "1", "1.5", "6", "0.33"]
    assert [gib(m) for m in (512, 1024, 1536, 81920, 1000)] == ["0.5", "1", "1.5", "80", "0.98"]
