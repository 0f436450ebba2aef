"""What start-time estimates cost at scale: the core's forecast (`gpupool.core.forecast`) on the scale benchmark's
steady cluster with `--pending` workloads waiting (100,000 by default).

Builds the cluster, organisation and nearly full steady state exactly as `scheduler_scale.py` does (same seed,
same generator), adds the pending workloads, then measures one `schedule()` (the cycle the estimates ride on)
and a forecast from that snapshot step by step: the time of each step (what a control plane that advances the
forecast one step per cycle adds to a cycle), the steps and total time to finish, and how many pending
workloads got a time. Runtimes come from a runtime model fed with seeded lognormal runtimes per project and
class (median 1 h), capped by a declared maximum for a third of the workloads.

Progress goes to stdout; the last line is one JSON object. One core (pinned where the platform allows).

    python benchmarks/forecast_cost.py                         # 1000 nodes, 100,000 pending
    python benchmarks/forecast_cost.py --nodes 100 --pending 2000
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import platform
import random
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from gpupool.core import SchedulerConfig, Snapshot, State, schedule
from gpupool.core.forecast import Forecast, Limits, runtimes_for
from gpupool.core.placement.memo import Memo
from gpupool.core.runtime_model import RuntimeModel
from gpupool.sim.apply import apply_decision
from gpupool.sim.pools import shared_pools
from scheduler_scale import (
    cluster,
    log,
    peak_rss_mib,
    pin_one_core,
    warm_up,
)

HISTORY_PER_KEY = 32
MEDIAN_RUNTIME_S = 3600.0
DECLARED_SHARE = 1 / 3


def history(projects: Sequence[str], classes: Sequence[str], rng: random.Random) -> RuntimeModel:
    model = RuntimeModel()
    for project in projects:
        for cls in classes:
            for _ in range(HISTORY_PER_KEY):
                model.observe(project, cls, rng.lognormvariate(math.log(MEDIAN_RUNTIME_S), 1.0))
    return model


def run(args: argparse.Namespace) -> dict[str, Any]:
    pinned = pin_one_core() if not args.no_pin else "not pinned (--no-pin)"
    log(f"forecast cost: nodes={args.nodes} pending={args.pending} seed={args.seed}; {pinned}")
    rng = random.Random(args.seed)
    nodes, _, queues, factory = cluster(args.nodes, rng)
    config = SchedulerConfig()
    now = 1000.0
    snapshot = Snapshot(nodes, queues, (), now=now + 1.0, pool_settings=shared_pools(nodes))
    fill = tuple(factory.standard(now) for _ in range(args.nodes * 10))
    snapshot = dataclasses.replace(snapshot, workloads=fill)
    snapshot = apply_decision(snapshot, schedule(snapshot, config), snapshot.now + 1.0)
    snapshot = warm_up(snapshot, factory, 20 * args.nodes, SchedulerConfig(actions=("allocate",)))
    fresh = tuple(factory.standard(snapshot.now) for _ in range(args.pending))
    snapshot = dataclasses.replace(snapshot, workloads=snapshot.workloads + fresh)
    running = sum(1 for w in snapshot.workloads if w.state is State.RUNNING)
    log(f"steady: {running} running, {args.pending} pending")

    model = history(factory.projects, ["production", "training", "interactive", "batch"], rng)
    declared = {w.id: rng.choice((4, 8, 24, 72)) * 3600.0 for w in snapshot.workloads if rng.random() < DECLARED_SHARE}
    t0 = time.perf_counter()
    runtimes = runtimes_for(snapshot, model, declared)
    runtimes_s = time.perf_counter() - t0

    memo = Memo()
    gc.collect()
    t0 = time.perf_counter()
    schedule(snapshot, config, memo=memo)
    cycle_s = time.perf_counter() - t0
    log(f"schedule(): {cycle_s:.3f}s; runtimes for {len(runtimes)} workloads: {runtimes_s:.3f}s")

    limits = Limits(max_steps=args.max_steps)
    f = Forecast(snapshot, runtimes, config, limits, memo)
    steps: list[float] = []
    more = True
    while more:
        t0 = time.perf_counter()
        more = f.step()
        steps.append(time.perf_counter() - t0)
        log(f"step {len(steps)}: {steps[-1]:.3f}s, ahead {f.at - snapshot.now:.0f}s")
    estimates = f.estimates()
    timed = sum(1 for e in estimates.values() if e.start is not None)
    result: dict[str, Any] = {
        "nodes": args.nodes,
        "running": running,
        "pending": args.pending,
        "schedule_s": round(cycle_s, 4),
        "runtimes_s": round(runtimes_s, 4),
        "forecast_steps": f.steps,
        "forecast_cycles": f.cycles,
        "forecast_total_s": round(sum(steps), 3),
        "forecast_step_p50_s": round(statistics.median(steps), 4),
        "forecast_step_max_s": round(max(steps), 4),
        "estimates": len(estimates),
        "estimates_with_time": timed,
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "max_steps": args.max_steps,
        "seed": args.seed,
        "python": platform.python_version(),
        "pinned": pinned,
    }
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000, help="8-GPU nodes (default 1000)")
    parser.add_argument("--pending", type=int, default=100_000, help="workloads waiting (default 100,000)")
    parser.add_argument("--max-steps", type=int, default=Limits().max_steps, help="the forecast's step budget")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-pin", action="store_true", help="do not pin the process to one CPU")
    args = parser.parse_args(argv)
    if args.nodes < 5 or args.pending < 1 or args.max_steps < 1:
        parser.error("--nodes must be at least 5, --pending and --max-steps at least 1")
    log(json.dumps(run(args), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
