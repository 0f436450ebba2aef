"""Right-sizing advice: the rule and its rounding with the exact sentences, and the report's GPU-hours freed from
telemetry written as the control loop writes it, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from gpupool.backends.base import MemberSample, Sample
from gpupool.control.policies import chains, effective
from gpupool.control.usage import account
from gpupool.lifecycle.phases import AllocPhase, Phase
from gpupool.services.auth import Principal
from gpupool.services.errors import Invalid, NotFound
from gpupool.services.rightsizing import Grant, Observed, advice_for, advise, report
from gpupool.store.engine import session_factory
from gpupool.store.tables import AllocationRow, NodeRow, QueueRow, WorkloadRow
from tests.control.test_usage import _org  # the same organisation: research, with vision and nlp

H100 = 81920  # MiB
ONE = Grant(gpus=1, milli=1000, memory_mib=H100, device_memory_mib=H100)
FOUR = Grant(gpus=4, milli=4000, memory_mib=4 * H100, device_memory_mib=H100)
HALF = Grant(gpus=0, milli=500, memory_mib=H100 // 2, device_memory_mib=H100)
T0 = 1_800_000_000.0  # a minute boundary


def _seen(peak_mib: int, util: int, busy: float, minutes: int = 60) -> Observed:
    allocated = 1000.0 * 60 * minutes
    return Observed(minutes, allocated, allocated * busy, peak_mib, util)


def test_a_gpu_kept_little_busy_with_little_memory_is_advised_a_fraction_or_its_memory() -> None:
    advice = advise(ONE, 1, _seen(3174, 100, 0.05))
    assert advice is not None
    assert advice.message == "used at most 3.1 GiB of 80, busy 5% of the time: ask `--gpu-memory 4GiB` or `--gpu 0.1`"
    assert (advice.rule, advice.gpu, advice.gpu_memory_mib, advice.gpus) == ("share", 0.1, 4096, None)
    assert (advice.advised_milli, advice.granted_milli) == (100, 1000)


def test_the_fraction_holds_twice_the_busy_share_and_the_memory_with_headroom() -> None:
    # 10% busy of one GPU: 0.2. 6 GiB with 25% is 7.5, rounded up to 8 GiB: a tenth of the device holds it.
    busy = advise(ONE, 1, _seen(6144, 100, 0.10))
    assert busy is not None and busy.message == (
        "used at most 6 GiB of 80, busy 10% of the time: ask `--gpu-memory 8GiB` or `--gpu 0.2`"
    )
    # 30 GiB with 25% is 38 GiB: half the device, so 0.5.
    big = advise(ONE, 1, _seen(30 * 1024, 40, 0.05))
    assert big is not None and (big.gpu_memory_mib, big.gpu) == (38 * 1024, 0.5)
    # Half a GPU, 20% busy: twice that of its 500 milli is 0.2. A gang hears it per worker.
    half = advise(HALF, 2, _seen(1000, 90, 0.20))
    assert half is not None and half.message == (
        "used at most 1 GiB of 40, busy 20% of the time: ask `--gpu-memory 2GiB` or `--gpu 0.2` per worker"
    )
    # A tiny footprint still asks for 1 GiB and a tenth.
    tiny = advise(ONE, 1, _seen(3, 1, 0.0))
    assert tiny is not None and tiny.message == (
        "used at most 0.1 GiB of 80, busy 0% of the time: ask `--gpu-memory 1GiB` or `--gpu 0.1`"
    )


@pytest.mark.parametrize(
    ("grant", "seen", "why"),
    [
        (ONE, _seen(3174, 100, 0.05, minutes=29), "under 30 minutes of samples"),
        (ONE, _seen(H100 // 2, 100, 0.05), "half its memory"),
        (ONE, _seen(3174, 100, 0.30), "busy 30% of the time"),
        (Grant(0, 100, H100 // 10, H100), _seen(100, 100, 0.01), "a tenth already: nothing smaller to ask"),
        (FOUR, _seen(3174, 80, 0.05), "at its busiest it kept all 4 GPUs busy (80% of 4 is 3.2)"),
        (FOUR, _seen(3 * H100 + 1, 10, 0.05), "its memory needs all 4 GPUs with headroom"),
    ],
)
def test_no_advice(grant: Grant, seen: Observed, why: str) -> None:
    assert advise(grant, 1, seen) is None, why


def test_several_whole_gpus_of_which_one_is_busy_are_advised_one() -> None:
    one = advise(FOUR, 1, _seen(30 * 1024, 25, 0.25))
    assert one is not None
    assert one.message == "busy at most 25% of 4 GPUs and used at most 30 GiB of 320: ask `--gpus 1`"
    assert (one.rule, one.gpus, one.advised_milli, one.granted_milli) == ("gpus", 1, 1000, 4000)
    # Busier than half of them, though under 30% busy on average: three.
    three = advise(FOUR, 1, _seen(1024, 60, 0.20))
    assert three is not None and three.gpus == 3
    # Two GPUs where one works: one, though 50% busy on average (the share rule would not apply).
    two = Grant(gpus=2, milli=2000, memory_mib=2 * H100, device_memory_mib=H100)
    assert (advice := advise(two, 4, _seen(2048, 50, 0.5))) is not None
    assert advice.message == "busy at most 50% of 2 GPUs and used at most 2 GiB of 160: ask `--gpus 1` per worker"
    # Memory sets the floor: 100 GiB with headroom needs two devices.
    assert (by_memory := advise(FOUR, 1, _seen(100 * 1024, 25, 0.25))) is not None and by_memory.gpus == 2


@given(
    peak=st.integers(0, H100),
    busy=st.floats(0, 1),
    milli=st.sampled_from([100, 250, 500, 700, 1000]),
    util=st.integers(0, 100),
)
def test_advice_never_asks_for_less_than_was_used(peak: int, busy: float, milli: int, util: int) -> None:
    grant = Grant(gpus=1 if milli == 1000 else 0, milli=milli, memory_mib=milli * H100 // 1000, device_memory_mib=H100)
    advice = advise(grant, 1, _seen(min(peak, grant.memory_mib), util, busy))
    if advice is not None:
        assert advice.gpu_memory_mib is not None and advice.gpu is not None
        assert advice.gpu_memory_mib >= peak * 1.25 and advice.gpu_memory_mib % 1024 == 0
        assert advice.advised_milli * H100 >= advice.gpu_memory_mib * 1000  # the fraction holds the memory asked
        assert advice.advised_milli >= busy * milli  # and the work it did
        assert advice.advised_milli < milli


# -- the report, from telemetry as the control loop writes it --------------------------------------------------


@pytest.fixture
def session(migrated_engine: Engine) -> Iterator[Session]:
    with session_factory(migrated_engine)() as s:
        yield s


def _holding(s: Session, name: str, project: QueueRow, gpus: int, milli: int = 0) -> WorkloadRow:
    """A running workload of one member on n1 (allocation `name`-0): whole GPUs 0..gpus-1, or `milli` of GPU 0."""
    devices = [{"index": i, "milli": 1000, "memory_mib": H100} for i in range(gpus)] or [
        {"index": 0, "milli": milli, "memory_mib": milli * H100 // 1000}
    ]
    member = AllocationRow(id=f"{name}-0", attempt=0, member=0, node="n1", state=AllocPhase.READY, created_at=T0,
                           devices=devices)  # fmt: skip
    row = WorkloadRow(
        name=name, project_id=project.id, owner_id=1, type="training", priority_class="training", priority=100,
        preemptible=True, grace_s=30, state=Phase.RUNNING, created_at=T0, queued_at=T0, started_at=T0, gpus=gpus,
        gpu_milli=milli, allocations=[member],
    )  # fmt: skip
    s.add(row)
    s.flush()
    return row


def test_the_report_totals_the_gpu_hours_the_advice_would_have_freed(session: Session) -> None:
    s = session
    org = _org(s)
    nb = _holding(s, "nb", org["vision"], gpus=1)
    ddp = _holding(s, "ddp", org["vision"], gpus=4)
    busy = _holding(s, "busy", org["nlp"], gpus=0, milli=500)
    rows = [nb, ddp, busy]
    policies = {qid: effective(chain) for qid, chain in chains(list(org.values())).items()}
    nodes = {"n1": s.get(NodeRow, "n1")}
    assert nodes["n1"] is not None
    # An hour of samples a minute apart; the notebook's memory peaks once (3.1 GiB) and falls back.
    for i in range(60):
        nb_mib = 3174 if i == 30 else 1024
        sample = Sample(
            {"nb-0": MemberSample(5, nb_mib), "ddp-0": MemberSample(25, 30 * 1024),
             "busy-0": MemberSample(90, 30 * 1024)},
            (), True,
        )  # fmt: skip
        account(s, rows, sample, policies, nodes, T0 + 60 * i, T0 + 60 * (i + 1))  # type: ignore[arg-type]
        s.commit()
    assert [(r.gpu_memory_peak_mib, r.gpu_util_peak_pct, r.gpu_memory_used_mib) for r in rows] == [
        (3174, 5, 1024), (30 * 1024, 25, 30 * 1024), (30 * 1024, 90, 30 * 1024),
    ]  # fmt: skip
    nb_advice = advice_for(s, nb)
    assert nb_advice is not None and nb_advice.message == (
        "used at most 3.1 GiB of 80, busy 5% of the time: ask `--gpu-memory 4GiB` or `--gpu 0.1`"
    )
    admin = Principal(0, "root", "admin")
    out = report(s, admin, T0, T0 + 7200)
    # ddp: 4 GPU-hours, 1 GPU would do: 3 freed. nb: 1 GPU-hour, 0.1 would do: 0.9 freed. busy: none.
    assert [(x.project, x.workload, x.gpu_hours, x.freed_gpu_hours, x.sampled_minutes) for x in out.lines] == [
        ("vision", "ddp", 4.0, 3.0, 60), ("vision", "nb", 1.0, 0.9, 60), ("nlp", "busy", 0.5, 0.0, 60),
    ]  # fmt: skip
    assert [(x.request, x.busy_pct, x.advice is None) for x in out.lines] == [
        ("4 GPUs", 25.0, False), ("1 GPU", 5.0, False), ("0.5 GPU", 90.0, True),
    ]  # fmt: skip
    assert [(t.project, t.gpu_hours, t.freed_gpu_hours, t.advised) for t in out.projects] == [
        ("nlp", 0.5, 0.0, 0), ("vision", 5.0, 3.9, 2),
    ]  # fmt: skip
    assert (out.total.gpu_hours, out.total.freed_gpu_hours, out.total.advised) == (5.5, 3.9, 2)
    # A period of half the hour frees half as much: the hours are the period's, the advice the workload's.
    assert report(s, admin, T0, T0 + 1800).total.freed_gpu_hours == pytest.approx(3.9 * 29 / 60)
    # A reader sees only its projects; another project is as if it did not exist.
    reader = Principal(1, "ana", "viewer", {org["nlp"].id: "viewer"})
    assert [x.workload for x in report(s, reader, T0, T0 + 7200).lines] == ["busy"]
    assert [x.workload for x in report(s, admin, T0, T0 + 7200, "vision").lines] == ["ddp", "nb"]
    with pytest.raises(NotFound, match="no project named 'vision'"):
        report(s, reader, T0, T0 + 7200, "vision")
    with pytest.raises(NotFound, match="no project named 'nope'"):
        report(s, admin, T0, T0 + 7200, "nope")
    with pytest.raises(Invalid, match="the period is empty"):
        report(s, admin, T0, T0)
