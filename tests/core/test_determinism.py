"""The same snapshot gives a byte-identical decision whatever the order of its parts."""

import dataclasses
import random

from gpupool.core import SchedulerConfig, Snapshot, schedule
from tests.core.builders import Cluster, Run


def busy_cluster() -> Snapshot:
    c = Cluster().pool("h100", nodes=3, gpus=8).pool("a100", nodes=2, gpus=4, model="A100")
    c.department("d1", deserved=16).department("d2", deserved=12)
    c.project("p1", department="d1", deserved=10, weight=2).project("p2", department="d1", deserved=6)
    c.project("p3", department="d2", deserved=12, limit=20)
    for i in range(12):
        c.submit(f"p1-{i}", "p1", gpus=1 + i % 3, priority="batch" if i % 2 else "training")
        c.submit(f"p2-{i}", "p2", gpu=0.25 * (1 + i % 3), priority="interactive")
        c.submit(f"p3-{i}", "p3", gpus=2, workers=1 + i % 2)
    run = Run(c.snapshot())
    run.cycle()
    for i in range(6):
        run.submit(c, f"late-{i}", "p2", gpus=2, priority="production")
    return run.snapshot


def shuffled(snap: Snapshot, seed: int) -> Snapshot:
    rng = random.Random(seed)

    def mix(items: tuple) -> tuple:  # type: ignore[type-arg]
        out = list(items)
        rng.shuffle(out)
        return tuple(out)

    return dataclasses.replace(snap, nodes=mix(snap.nodes), queues=mix(snap.queues), workloads=mix(snap.workloads))


def test_input_order_does_not_change_the_decision() -> None:
    snap = busy_cluster()
    for policy in ("gpupool", "packing", "random"):
        config = SchedulerConfig(policy=policy, seed=7)
        expected = schedule(snap, config).to_json()
        for seed in range(5):
            assert schedule(shuffled(snap, seed), config).to_json() == expected


def test_a_busy_cluster_settles_and_stays_settled() -> None:
    Run(busy_cluster()).settle()
