"""Water-filling fair share over the queue tree."""

from gpupool.core import Queue, Quota
from gpupool.core.fairshare import capped_demand, fair_shares
from gpupool.core.state import build_tree


def tree(*queues: Queue):  # type: ignore[no-untyped-def]
    return build_tree(queues)


def q(name: str, parent: str | None = None, deserved: int = 0, limit: int | None = None, weight: int = 1) -> Queue:
    return Queue(name, parent, {"p": Quota(deserved, limit, weight)})


def test_run_ai_worked_example() -> None:
    # Run:ai: 3/(2+3+1) x 20 unused = 10, so fair share = 6 + 10 = 16.
    t = tree(q("a", deserved=2000, weight=2), q("b", deserved=6000, weight=3), q("c", deserved=2000, weight=1))
    demand = capped_demand(t, "p", [100_000, 100_000, 100_000])
    shares = fair_shares(t, "p", 30_000, demand)
    assert shares[t.index["b"]] == 16_000
    assert sum(shares) == 30_000


def test_demand_and_limit_cap_the_share_and_the_rest_flows_on() -> None:
    t = tree(q("a", deserved=2000), q("b", deserved=2000, limit=3000), q("c", deserved=2000))
    demand = capped_demand(t, "p", [1000, 10_000, 10_000])
    shares = fair_shares(t, "p", 12_000, demand)
    assert [shares[t.index[n]] for n in "abc"] == [1000, 3000, 8000]


def test_children_share_what_their_parent_gets() -> None:
    t = tree(
        q("d1", deserved=4000),
        q("d2", deserved=4000),
        q("p1", "d1", deserved=2000),
        q("p2", "d1", deserved=2000, weight=3),
        q("p3", "d2", deserved=4000),
    )
    demand = capped_demand(t, "p", [0, 0, 10_000, 10_000, 1000])
    shares = fair_shares(t, "p", 8000, demand)
    assert shares[t.index["d2"]] == 1000 and shares[t.index["d1"]] == 7000
    assert shares[t.index["p1"]] + shares[t.index["p2"]] == 7000
    assert shares[t.index["p2"]] > shares[t.index["p1"]]


def test_oversubscribed_deserved_is_scaled_down() -> None:
    t = tree(q("a", deserved=6000), q("b", deserved=6000))
    shares = fair_shares(t, "p", 8000, capped_demand(t, "p", [10_000, 10_000]))
    assert shares[t.index["a"]] == shares[t.index["b"]] == 4000


def test_remainders_are_handed_out_deterministically() -> None:
    t = tree(q("a"), q("b"), q("c"))
    shares = fair_shares(t, "p", 1000, capped_demand(t, "p", [5000, 5000, 5000]))
    assert sum(shares) == 1000 and max(shares) - min(shares) <= 1
