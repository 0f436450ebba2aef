"""Run the packing experiment over seeds and policies, and write what it found: JSON, CSV, plots, a table."""

from __future__ import annotations

import csv
import json
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.core import policy_names
from gpupool.sim.packing import MAX_PCT, Point, run_seed
from gpupool.sim.traces import load_nodes, load_pods

PUBLISHED_UNALLOCATED_AT_100: dict[str, dict[str, float]] = {
    # FGD (ATC'23) authors' results: unallocated GPU % at 100% arrived, mean of seeds 42-51.
    "default": {"random": 13.70, "dotprod": 9.38, "clustering": 8.35, "packing": 8.22, "bestfit": 7.14, "fgd": 4.77},
    "cpu050": {"random": 10.98, "dotprod": 6.97, "clustering": 6.48, "packing": 6.54, "bestfit": 6.44, "fgd": 5.00},
    "cpu100": {"random": 12.57, "dotprod": 8.27, "clustering": 7.58, "packing": 7.50, "bestfit": 6.74, "fgd": 4.79},
    "cpu200": {"random": 16.97, "dotprod": 12.55, "clustering": 10.33, "packing": 10.02, "bestfit": 7.85, "fgd": 5.18},
    "cpu250": {"random": 20.00, "dotprod": 16.43, "clustering": 12.25, "packing": 11.95, "bestfit": 8.79, "fgd": 6.80},
    "gpushare40": {
        "random": 15.14,
        "dotprod": 10.70,
        "clustering": 10.24,
        "packing": 10.23,
        "bestfit": 8.56,
        "fgd": 6.04,
    },
    "gpushare60": {
        "random": 17.19,
        "dotprod": 13.18,
        "clustering": 13.10,
        "packing": 12.85,
        "bestfit": 10.94,
        "fgd": 8.75,
    },
    "gpushare80": {
        "random": 19.38,
        "dotprod": 15.86,
        "clustering": 15.50,
        "packing": 15.35,
        "bestfit": 13.34,
        "fgd": 10.92,
    },
    "gpushare100": {
        "random": 21.10,
        "dotprod": 18.02,
        "clustering": 17.78,
        "packing": 17.87,
        "bestfit": 15.38,
        "fgd": 13.36,
    },
}
POLICY_ORDER = ("random", "dotprod", "clustering", "packing", "bestfit", "fgd", "gpupool")


@dataclass(frozen=True)
class Job:
    nodes: Path
    pods: Path
    policy: str
    seed: int
    tune: float


def parse_seeds(text: str) -> list[int]:
    """`42-51`, `42,45` or `42`."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if hi < lo:
                    raise ValueError
                seeds.extend(range(lo, hi + 1))
            else:
                seeds.append(int(part))
    except ValueError:
        raise ValueError(f"seeds must look like 42-51 or 42,43: got {text!r}") from None
    return seeds


def trace_name(pods: Path) -> str:
    stem = pods.stem
    return stem.removeprefix("openb_pod_list_")


def run_job(job: Job) -> list[Point]:
    return run_seed(load_nodes(job.nodes), load_pods(job.pods), job.policy, job.seed, job.tune)


def run_all(
    jobs: Sequence[Job], workers: int, on_done: Callable[[Job], None] | None = None
) -> dict[tuple[str, int], list[Point]]:
    """Every (policy, seed) job, `workers` at a time, results keyed by (policy, seed)."""
    results: dict[tuple[str, int], list[Point]] = {}
    if workers <= 1:
        for job in jobs:
            results[(job.policy, job.seed)] = run_job(job)
            if on_done:
                on_done(job)
        return results
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run_job, job): job for job in jobs}
        for future, job in futures.items():
            results[(job.policy, job.seed)] = future.result()
            if on_done:
                on_done(job)
    return results


def summarise(policy: str, pods: Path, seeds: list[int], runs: list[list[Point]]) -> dict[str, Any]:
    points = []
    for k in range(MAX_PCT + 1):
        unalloc = [run[k].unallocated_gpu_pct for run in runs]
        frag = [run[k].frag_rate_pct for run in runs]
        points.append(
            {
                "arrived_pct": k,
                "unallocated_gpu_pct": round(statistics.fmean(unalloc), 4),
                "unallocated_gpu_pct_sd": round(statistics.stdev(unalloc), 4) if len(unalloc) > 1 else 0.0,
                "frag_rate_pct": round(statistics.fmean(frag), 4),
            }
        )
    return {"policy": policy, "pods_file": str(pods), "seeds": seeds, "points": points}


def write_policy(out: Path, summary: dict[str, Any], runs: dict[int, list[Point]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    for seed, points in sorted(runs.items()):
        with (out / f"seed-{seed}.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(
                [
                    "arrived_pct",
                    "allocated_milli",
                    "total_milli",
                    "unallocated_gpu_pct",
                    "frag_rate_pct",
                    "placed",
                    "failed",
                ]
            )
            for p in points:
                w.writerow(
                    [
                        p.arrived_pct,
                        p.allocated_milli,
                        p.total_milli,
                        f"{p.unallocated_gpu_pct:.4f}",
                        f"{p.frag_rate_pct:.4f}",
                        p.placed,
                        p.failed,
                    ]
                )
    plot([summary], out / "unallocated.png", f"{summary['policy']} on {trace_name(Path(summary['pods_file']))}")


def plot(summaries: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for s in summaries:
        xs = [p["arrived_pct"] for p in s["points"]]
        left.plot(xs, [p["unallocated_gpu_pct"] for p in s["points"]], label=s["policy"])
        right.plot(xs, [p["frag_rate_pct"] for p in s["points"]], label=s["policy"])
    left.plot([0, 100], [100, 0], color="grey", linestyle=":", label="ideal")
    left.set(xlabel="arrived GPU requests (% of capacity)", ylabel="unallocated GPUs (%)", xlim=(80, 130), ylim=(0, 25))
    right.set(xlabel="arrived GPU requests (% of capacity)", ylabel="fragmentation rate (% of idle GPUs)")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def comparison_table(trace: str, summaries: dict[str, dict[str, Any]]) -> str:
    published = PUBLISHED_UNALLOCATED_AT_100.get(trace, {})
    lines = [
        f"Unallocated GPUs (%) at 100% arrived, `{trace}` trace, mean ± sd over seeds {_seeds(summaries)}",
        "",
        "| policy | gpupool's simulator | published (FGD, ATC'23) | difference |",
        "|---|---|---|---|",
    ]
    for name in [p for p in POLICY_ORDER if p in summaries]:
        point = summaries[name]["points"][100]
        ours = point["unallocated_gpu_pct"]
        theirs = published.get(name)
        diff = f"{ours - theirs:+.2f}" if theirs is not None else "—"
        shown = f"{theirs:.2f}" if theirs is not None else "—"
        lines.append(f"| {name} | {ours:.2f} ± {point['unallocated_gpu_pct_sd']:.2f} | {shown} | {diff} |")
    return "\n".join(lines) + "\n"


def _seeds(summaries: dict[str, dict[str, Any]]) -> str:
    seeds = next(iter(summaries.values()))["seeds"]
    return f"{seeds[0]}–{seeds[-1]}" if len(seeds) > 1 else str(seeds[0])


def known_policies() -> tuple[str, ...]:
    return tuple(p for p in POLICY_ORDER if p in policy_names())
