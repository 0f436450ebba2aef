"""What the sweep tests say when they fail: each trial as the server tells it (state, value, last step, and why it
ended as it did), with its workload's events and the end of its output, so a failure seen once in a loaded run
says why."""

from __future__ import annotations

import json
from typing import Any

from tests.e2e.conftest import Server


def trials_said(s: Server, sweep: str, project: str = "vision", tail: int = 8) -> str:
    """Every trial of `sweep`, and its workload's events and last `tail` lines of output."""
    d: dict[str, Any] = s.json("sweep", "describe", sweep, "-p", project)
    lines = [f"sweep {project}/{sweep}: {d['state']}, best {json.dumps(d['best'])}"]
    for t in d["trial_list"]:
        lines.append(
            f"trial {t['number']}: {t['state']} value={t['value']!r} last_step={t['last_step']} "
            f"params={t['params']} reason={t.get('reason')!r} workload={t['workload']}"
        )
        if t["workload"] is None:
            continue
        w = s.json("describe", t["workload"], "-p", project)
        lines.append(f"  workload {w['name']}: {w['state']} exit_code={w.get('exit_code')!r}")
        lines += [f"  {e['at']:.3f} {e['state']} {e['code']}: {e['reason']}" for e in w["events"]]
        out = s.cli("logs", t["workload"], "-p", project, check=False).stdout.splitlines()
        lines += [f"  | {line}" for line in out[-tail:]]
    return "\n".join(lines)


def most_at_once(s: Server, workloads: list[str], project: str = "vision") -> int:
    """The most of `workloads` that held GPUs at once, by their own events (each from its placement to its end):
    the server's record, not what a test polling a loaded host happened to see."""
    edges: list[tuple[float, int]] = []
    with s.client() as c:
        for name in workloads:
            events = c.describe(name, project).events
            edges.append((next(e.at for e in events if e.code == "placed"), 1))
            edges.append((next(e.at for e in events if e.state in ("succeeded", "failed", "cancelled")), -1))
    most = held = 0
    for _, change in sorted(edges):  # an end and a placement in one cycle: the end first
        held += change
        most = max(most, held)
    return most
