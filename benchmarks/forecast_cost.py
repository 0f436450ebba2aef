"""What start-time estimates cost at scale: the core's forecast (`gpupool.core.forecast`) on the scale benchmark's
steady cluster with `--pending` workloads waiting (100,000 by default).

Builds the cluster, organisation and nearly full steady state exactly as `scheduler_scale.py` does (same seed,
same generator), adds the pending workloads, then measures one `schedule()` (the cycle the estimates ride on)
and a forecast from that snapshot (`estimate_cost.py`): forked as the live loop runs it (what the fork and the
read-back cost the loop, and how long the child takes), and step by step (what a loop without fork that spreads
the steps over its cycles pays), and how many pending workloads got a time.

Progress goes to stdout; the last line is one JSON object. One core (pinned where the platform allows).

    python benchmarks/forecast_cost.py                         # 1000 nodes, 100,000 pending
    python benchmarks/forecast_cost.py --nodes 100 --pending 2000
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import platform
import random
import sys
import time
from collections.abc import Sequence
from typing import Any

from estimate_cost import measure
from gpupool.core import SchedulerConfig, Snapshot, State, schedule
from gpupool.core.forecast import Limits
from gpupool.sim.apply import apply_decision
from gpupool.sim.pools import shared_pools
from scheduler_scale import (
    cluster,
    log,
    peak_rss_mib,
    pin_one_core,
    warm_up,
)


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

    gc.collect()
    t0 = time.perf_counter()
    schedule(snapshot, config)
    cycle_s = time.perf_counter() - t0
    log(f"schedule(): {cycle_s:.3f}s")
    forecast = measure(snapshot, config, factory.projects, rng, limits=Limits(max_steps=args.max_steps), log=log)
    result: dict[str, Any] = {
        "nodes": args.nodes,
        "running": running,
        "pending": args.pending,
        "schedule_s": round(cycle_s, 4),
        "forecast": forecast,
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
