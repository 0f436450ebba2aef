"""Burst pools (`core/burst.py`): when to rent cloud nodes, how many, and when to give them back."""

from __future__ import annotations

import random
from fractions import Fraction

from gpupool.core import Placement, Queue, Request, Snapshot, State, Workload
from gpupool.core.burst import (
    OVER_BUDGET,
    POOLS_FULL,
    BurstNode,
    BurstPlan,
    BurstPool,
    BurstRequest,
    DepartmentBurst,
    accrued,
    cost_micro,
    department_of,
    plan,
)
from gpupool.core.decision import PendingCode

NOW = 100_000.0
CLOUD = BurstPool("cloud", price_micro=2_500_000, delay_s=300.0, max_gpus=64, gpu_model="H100")
NODE_HOUR = 8 * 2_500_000
"""What one 8-GPU node of CLOUD costs for an hour, in micro-dollars."""
QUEUES = (
    Queue("research"),
    Queue("vision", "research"),
    Queue("nlp", "research"),
    Queue("ops"),
    Queue("serve", "ops"),
)


def job(
    wid: str,
    waited: float = 3_600.0,
    project: str = "vision",
    gpus: int = 8,
    gang: int = 1,
    milli: int = 0,
    models: tuple[str, ...] = (),
    pools: tuple[str, ...] = (),
) -> Workload:
    request = Request(gpu_milli=milli) if milli else Request(gpus=gpus)
    return Workload(wid, project, request, gang_size=gang, gpu_models=models, pools=pools, submit_time=NOW - waited)


def running_on(wid: str, node: str, project: str = "vision") -> Workload:
    return Workload(
        wid, project, Request(gpus=8), state=State.RUNNING, placements=(Placement(0, node),), start_time=NOW - 60
    )


def dept(
    name: str = "research", threshold: float | None = 1_800.0, budget: int | None = None, spent: int = 0
) -> DepartmentBurst:
    return DepartmentBurst(name, threshold, budget, spent)


def node(name: str, department: str = "research", ready: bool = True, idle_for: float | None = None) -> BurstNode:
    idle_since = None if idle_for is None else NOW - idle_for
    return BurstNode(name, "cloud", department, NOW - 3_600, NOW - 3_000 if ready else None, idle_since)


def burst(
    workloads: list[Workload],
    departments: list[DepartmentBurst] | None = None,
    nodes: list[BurstNode] | None = None,
    pools: list[BurstPool] | None = None,
    **kwargs: object,
) -> BurstPlan:
    snapshot = Snapshot((), QUEUES, tuple(workloads), NOW)
    depts = {d.department: d for d in (departments if departments is not None else [dept(), dept("ops")])}
    return plan(snapshot, pools or [CLOUD], depts, nodes or [], **kwargs)  # type: ignore[arg-type]


def test_only_work_past_its_departments_threshold_is_demand() -> None:
    decided = burst([job("old", waited=1_800.0), job("young", waited=1_799.0)])
    assert decided.requests == (BurstRequest("cloud", "research", 1, ("old",)),)


def test_a_department_without_a_threshold_never_bursts() -> None:
    decided = burst([job("a", waited=86_400.0)], [dept(threshold=None)])
    assert decided == BurstPlan()


def test_work_packs_onto_whole_nodes_oldest_first() -> None:
    """Three 4-GPU jobs need two 8-GPU nodes; the request names them oldest first."""
    decided = burst([job("b", 4_000, gpus=4), job("a", 5_000, gpus=4), job("c", 3_000, gpus=4)])
    assert decided.requests == (BurstRequest("cloud", "research", 2, ("a", "b", "c")),)


def test_fractions_share_a_device() -> None:
    decided = burst([job(f"nb-{i:02d}", milli=500) for i in range(16)])
    assert [r.nodes for r in decided.requests] == [1]


def test_supply_in_flight_counts_against_demand() -> None:
    """A node still provisioning and a ready idle one take two 8-GPU jobs; only the third asks for a node."""
    nodes = [node("b-1", ready=False), node("b-2", idle_for=60.0)]
    decided = burst([job("a", 5_000), job("b", 4_000), job("c", 3_000)], nodes=nodes)
    assert decided.requests == (BurstRequest("cloud", "research", 1, ("c",)),)
    assert decided.releases == ()


def test_another_departments_supply_does_not_count() -> None:
    decided = burst([job("a")], nodes=[node("b-1", department="ops", ready=False)])
    assert decided.requests == (BurstRequest("cloud", "research", 1, ("a",)),)


def test_the_budget_caps_the_ask_and_the_refusal_says_so() -> None:
    """Spent $5 and one node held ($20 for the hour ahead): a budget of $55 pays for one more node-hour, not two."""
    spent = 5_000_000
    budget = spent + NODE_HOUR + NODE_HOUR + NODE_HOUR // 2
    workloads = [job(f"w{i}", 5_000 - i) for i in range(4)] + [running_on("r", "b-1")]
    decided = burst(workloads, [dept(budget=budget, spent=spent)], [node("b-1")])
    assert decided.requests == (BurstRequest("cloud", "research", 1, ("w0",)),)
    assert decided.refused == (("research", OVER_BUDGET),)


def test_a_zero_budget_asks_for_nothing() -> None:
    decided = burst([job("a")], [dept(budget=0)])
    assert decided.requests == ()
    assert decided.refused == (("research", OVER_BUDGET),)


def test_a_pool_never_grows_past_its_maximum_counting_every_department() -> None:
    pool = BurstPool("cloud", 2_500_000, 300.0, max_gpus=16)
    workloads = [job("a", 5_000), job("b", 4_000), job("c", 3_000), running_on("r", "o-1", "serve")]
    decided = burst(workloads, nodes=[node("o-1", department="ops")], pools=[pool])
    assert decided.requests == (BurstRequest("cloud", "research", 1, ("a",)),)
    assert decided.refused == (("research", POOLS_FULL),)


def test_the_cheapest_pool_is_asked_first() -> None:
    dear = BurstPool("a-dear", 3_000_000, 60.0, 64)
    cheap = BurstPool("z-cheap", 2_000_000, 900.0, 64)
    decided = burst([job("a")], pools=[dear, cheap])
    assert decided.requests == (BurstRequest("z-cheap", "research", 1, ("a",)),)


def test_pools_of_one_price_are_tried_by_name() -> None:
    decided = burst([job("a")], pools=[BurstPool("b", 1, 0.0, 8), BurstPool("a", 1, 0.0, 8)])
    assert decided.requests == (BurstRequest("a", "research", 1, ("a",)),)


def test_a_gangs_nodes_all_come_from_one_pool() -> None:
    """Three 8-GPU members: the cheap pool holds two nodes only, so all three come from the dear one."""
    cheap = BurstPool("cheap", 1_000_000, 0.0, max_gpus=16)
    dear = BurstPool("dear", 2_000_000, 0.0, max_gpus=64)
    decided = burst([job("g", gang=3)], pools=[cheap, dear])
    assert decided.requests == (BurstRequest("dear", "research", 3, ("g",)),)


def test_a_gang_of_small_members_shares_nodes() -> None:
    decided = burst([job("g", gpus=4, gang=4)])
    assert decided.requests == (BurstRequest("cloud", "research", 2, ("g",)),)


def test_work_a_burst_node_cannot_hold_is_not_demand() -> None:
    workloads = [
        job("too-big", gpus=16),
        job("other-model", models=("A100",)),
        job("other-pool", pools=("onprem",)),
        job("cpu-only", gpus=0),
    ]
    decided = burst(workloads)
    assert decided == BurstPlan()


def test_work_waiting_for_a_reason_capacity_does_not_answer_is_not_demand() -> None:
    reasons = {"capped": PendingCode.OVER_LIMIT, "evicting": PendingCode.WAITING_FOR_EVICTIONS}
    reasons["full"] = PendingCode.NO_NODE_FITS
    decided = burst([job("capped"), job("evicting"), job("full"), job("untried")], reasons=reasons)
    assert decided.requests == (BurstRequest("cloud", "research", 1, ("full",)),)


def test_an_idle_node_goes_back_after_the_idle_time_and_a_busy_one_never() -> None:
    nodes = [node("b-1", idle_for=600.0), node("b-2", idle_for=599.0), node("b-3", idle_for=3_000.0)]
    decided = burst([running_on("r", "b-3")], nodes=nodes)  # b-3's idle time is stale: work runs on it
    assert decided.releases == ("b-1",)


def test_a_provisioning_node_is_never_released() -> None:
    decided = burst([], nodes=[node("b-1", ready=False)])
    assert decided.releases == ()


def test_a_department_nearing_its_budget_drains_its_newest_nodes_and_gives_back_drained_idle_ones() -> None:
    """Spent $50 of $80 with four nodes ($20 each for the hour ahead): the two oldest are kept ($50, then $70 before
    them), the two newer drain ($90, $110), and the drained one that is empty goes back at once."""
    nodes = [
        BurstNode("b-1", "cloud", "research", NOW - 9_000, NOW - 8_000, None),
        BurstNode("b-2", "cloud", "research", NOW - 5_000, NOW - 4_000, None),
        BurstNode("b-3", "cloud", "research", NOW - 3_000, NOW - 2_000, None),
        BurstNode("b-4", "cloud", "research", NOW - 2_000, NOW - 1_000, NOW - 10),
    ]
    workloads = [running_on("r1", "b-1"), running_on("r2", "b-2"), running_on("r3", "b-3")]
    decided = burst(workloads, [dept(budget=80_000_000, spent=50_000_000)], nodes)
    assert decided.drains == ("b-3",)
    assert decided.releases == ("b-4",)
    assert decided.evictions == ()


def test_a_node_just_asked_for_does_not_drain() -> None:
    """The ask reserved its hour: right after it, spending a little more does not drain it."""
    asked = burst([job("a")], [dept(budget=NODE_HOUR)])
    assert asked.requests == (BurstRequest("cloud", "research", 1, ("a",)),)
    after = burst([job("a")], [dept(budget=NODE_HOUR, spent=1)], [node("b-1", ready=False)])
    assert after == BurstPlan()


def test_the_oldest_node_drains_once_spending_reaches_the_pace() -> None:
    paced = DepartmentBurst("research", 1_800.0, 10 * NODE_HOUR, NODE_HOUR, accrued_micro=NODE_HOUR)
    decided = burst([running_on("r", "b-1")], [paced, dept("ops")], [node("b-1")])
    assert decided.drains == ("b-1",)
    assert decided.evictions == ()


def test_asks_are_paced_by_the_accrued_budget() -> None:
    """Of a $1,000 budget, $50 has accrued: with $5 spent, that pays for two node-hours, not the three waiting."""
    paced = DepartmentBurst("research", 1_800.0, 1_000_000_000, 5_000_000, accrued_micro=50_000_000)
    decided = burst([job("a", 5_000), job("b", 4_000), job("c", 3_000)], [paced])
    assert decided.requests == (BurstRequest("cloud", "research", 2, ("a", "b")),)
    assert decided.refused == (("research", OVER_BUDGET),)


def test_a_budget_accrues_evenly_over_its_period() -> None:
    assert accrued(3_000_000_000, 86_400.0, 30 * 86_400.0) == 100_000_000
    assert accrued(3_000_000_000, -1.0, 30 * 86_400.0) == 0
    assert accrued(3_000_000_000, 31 * 86_400.0, 30 * 86_400.0) == 3_000_000_000


def test_a_spent_budget_stops_the_work_on_the_departments_nodes() -> None:
    nodes = [node("b-1"), node("o-1", department="ops")]
    workloads = [running_on("r1", "b-1"), running_on("r2", "o-1", "serve")]
    decided = burst(workloads, [dept(budget=40_000_000, spent=40_000_000), dept("ops")], nodes)
    assert decided.evictions == ("r1",)
    assert decided.drains == ("b-1",)
    lenient = DepartmentBurst("research", 1_800.0, 40_000_000, 40_000_000, stop_at_budget=False)
    assert burst(workloads, [lenient, dept("ops")], nodes).evictions == ()


def test_the_department_is_the_top_of_the_tree() -> None:
    queues = (Queue("org"), Queue("research", "org"), Queue("vision", "research"))
    assert department_of(queues, "vision") == "org"
    assert department_of(queues, "org") == "org"
    assert department_of(queues, "unknown") is None


def test_costs_are_exact_and_rounded_up() -> None:
    assert cost_micro(8, 2_500_000, 1.0) == 20_000_000
    assert cost_micro(8, 2_500_000, Fraction(60, 3600)) == 333_334  # 333,333.3 rounded up
    assert cost_micro(1, 3_600_000, Fraction(7, 3600)) == 7_000


def test_the_plan_is_the_same_whatever_the_order_of_its_inputs() -> None:
    workloads = [
        job(f"w{i:02d}", 2_000 + 100 * (i % 5), gpus=1 + i % 8, project=("vision", "nlp", "serve")[i % 3])
        for i in range(40)
    ] + [running_on("r", "b-4")]
    pools = [CLOUD, BurstPool("other", 2_500_000, 60.0, 32), BurstPool("dear", 9_000_000, 60.0, 64)]
    nodes = [node("b-1", ready=False), node("b-2", idle_for=30.0), node("b-3", "ops", idle_for=900.0)]
    nodes.append(node("b-4"))
    depts = [dept(budget=7 * NODE_HOUR, spent=NODE_HOUR), dept("ops", budget=None)]
    first = burst(workloads, depts, nodes, pools)
    assert first.requests and first.refused and first.releases
    rng = random.Random(7)
    for _ in range(5):
        for items in (workloads, depts, nodes, pools):
            rng.shuffle(items)  # type: ignore[arg-type]
        assert burst(workloads, depts, nodes, pools) == first
