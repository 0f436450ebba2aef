"""How well online share placement can do where nothing but GPU shares matters.

    python benchmarks/packing_ideal.py [--trace default] [--seeds 42-51]

The FGD experiment's arrivals (`sim.packing.arrivals`, the same seeds) go into one pool of interchangeable
GPUs: no nodes, no CPUs, no memory. Whole-GPU pods take free GPUs while there are any; a share goes to a
GPU chosen by the rule under test; a pod that does not fit is dropped. At 100% arrived it prints the
unallocated GPU % for:
- `best_fit`: the smallest gap that fits, else a free GPU;
- `gap_table`: the gap that raises expected idle capacity least, by `core.placement.gaps.gap_waste` learned
  from the typical mix (what `gpupool` adds to FGD's score);
- `hindsight`: the slivers best-fit decreasing leaves over the shares the gap table placed (it knows the
  future).
It separates what online arrival costs from what nodes and CPUs cost. Last line: JSON.
"""

from __future__ import annotations

import argparse
import bisect
import json
import platform
import random
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

from gpupool.core import MILLI
from gpupool.core.placement.gaps import GapWaste, gap_waste, gpu_shapes
from gpupool.sim.fragmentation import typical_mix
from gpupool.sim.packing import arrivals
from gpupool.sim.traces import Pod, load_nodes, load_pods

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "alibaba-gpu-v2023" / "csv"

Rule = Callable[[dict[int, int], int, int], int | None]
"""(gap size -> GPUs with that gap, share, free GPUs) -> the gap to use (MILLI: a free GPU), or None."""


def best_fit(gaps: dict[int, int], share: int, free: int) -> int | None:
    fitting = [g for g in gaps if g >= share]
    return min(fitting) if fitting else (MILLI if free else None)


def by_table(waste: GapWaste) -> Rule:
    def rule(gaps: dict[int, int], share: int, free: int) -> int | None:
        options = [g for g in gaps if g >= share] + ([MILLI] if free else [])
        return min(options, key=lambda g: (waste[g - share] - waste[g], g), default=None)

    return rule


def replay(sequence: Sequence[Pod], gpus: int, rule: Rule) -> tuple[float, list[int]]:
    """Unallocated GPU % at 100% arrived, and the shares placed."""
    gaps: dict[int, int] = {}
    free, arrived, placed = gpus, 0, []
    for pod in sequence:
        arrived += pod.gpu_request_milli
        if arrived > gpus * MILLI:
            break
        if pod.num_gpu and pod.gpu_milli >= MILLI:
            if free >= pod.num_gpu:
                free -= pod.num_gpu
            continue
        if not pod.num_gpu:
            continue
        gap = rule(gaps, pod.gpu_milli, free)
        if gap is None:
            continue
        if gap == MILLI:
            free -= 1
        else:
            gaps[gap] -= 1
            if not gaps[gap]:
                del gaps[gap]
        left = gap - pod.gpu_milli
        if left:
            gaps[left] = gaps.get(left, 0) + 1
        placed.append(pod.gpu_milli)
    idle = free * MILLI + sum(g * n for g, n in gaps.items())
    return 100 * idle / (gpus * MILLI), placed


def hindsight(placed: list[int], gpus: int) -> float:
    """Best-fit decreasing over the same shares: the slivers it leaves, as % of the pool."""
    gaps: list[int] = []
    for share in sorted(placed, reverse=True):
        at = bisect.bisect_left(gaps, share)
        if at < len(gaps):
            bisect.insort(gaps, gaps.pop(at) - share)
        else:
            bisect.insort(gaps, MILLI - share)
    return 100 * sum(gaps) / (gpus * MILLI)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="default")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--traces", type=Path, default=TRACES)
    args = parser.parse_args()
    first, _, last = args.seeds.partition("-")
    seeds = range(int(first), int(last or first) + 1)
    nodes = load_nodes(args.traces / "openb_node_list_gpu_node.csv")
    pods = load_pods(args.traces / f"openb_pod_list_{args.trace}.csv")
    gpus = sum(len(n.devices) for n in nodes)
    table = by_table(gap_waste(gpu_shapes(typical_mix(pods))))
    results: dict[str, list[float]] = {"best_fit": [], "gap_table": [], "hindsight": []}
    for seed in seeds:
        sequence = arrivals(pods, gpus * MILLI, 1.3, random.Random(seed))
        results["best_fit"].append(replay(sequence, gpus, best_fit)[0])
        pct, placed = replay(sequence, gpus, table)
        results["gap_table"].append(pct)
        results["hindsight"].append(hindsight(placed, gpus))
    summary = {name: round(statistics.mean(v), 3) for name, v in results.items()}
    for name, mean in summary.items():
        print(f"{name:>10}: {mean:.2f}% unallocated at 100% arrived (seeds {args.seeds})")
    print(
        json.dumps(
            {
                "trace": args.trace,
                "seeds": args.seeds,
                "unallocated_pct": summary,
                "machine": platform.machine(),
                "python": platform.python_version(),
            }
        )
    )


if __name__ == "__main__":
    main()
