"""Time one seed of the FGD packing experiment (default trace, 130% of capacity) for each policy.

    python benchmarks/sim_packing.py [--policies gpupool,fgd] [--seed 42] [--trace default]

Prints a line per policy and, last, one JSON object: seconds per policy and the unallocated GPU % at 100%
arrived. The issue's target: at most 20 s for one seed of the default trace on this machine (the authors'
Go simulator takes about 10 minutes per run on 2 vCPUs).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from gpupool.sim.packing import run_seed
from gpupool.sim.traces import load_nodes, load_pods

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "alibaba-gpu-v2023" / "csv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="random,dotprod,clustering,packing,bestfit,fgd,gpupool")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--trace", default="default")
    parser.add_argument("--traces", type=Path, default=TRACES)
    args = parser.parse_args()
    nodes = load_nodes(args.traces / "openb_node_list_gpu_node.csv")
    pods = load_pods(args.traces / f"openb_pod_list_{args.trace}.csv")
    seconds: dict[str, float] = {}
    unallocated: dict[str, float] = {}
    for policy in args.policies.split(","):
        start = time.perf_counter()
        points = run_seed(nodes, pods, policy, args.seed)
        seconds[policy] = round(time.perf_counter() - start, 2)
        unallocated[policy] = round(points[100].unallocated_gpu_pct, 2)
        print(f"{policy:>10}: {seconds[policy]:6.2f} s, {unallocated[policy]:.2f}% unallocated at 100% arrived")
    print(
        json.dumps(
            {
                "trace": args.trace,
                "seed": args.seed,
                "seconds": seconds,
                "unallocated_gpu_pct_at_100": unallocated,
                "max_seconds": max(seconds.values()),
                "python": platform.python_version(),
            }
        )
    )


if __name__ == "__main__":
    main()
