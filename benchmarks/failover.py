"""Failover under a submit storm: two replicas on one PostgreSQL and one data dir (local backend, simulated GPUs);
the leader is killed (SIGKILL) at a random moment of a storm of submits, `--rounds` times.

Each round: a storm of `--storm` submits (each with its own Idempotency-Key, spread over both replicas, sent again
to the other replica when one does not answer) of 1-GPU workloads that note each start of their process and run
`--work` seconds; at a random moment in its first `--window` seconds the leader is killed; the killed replica
is started again (it comes back as a standby). Measured:

* takeover_s: from the kill to the standby holding the lease (a new epoch in the store);
* first_start_s: from the kill to the first workload of the round that was still pending at the kill running;
* lost: acknowledged submits missing from the store; duplicated: names with more than one row;
* started_twice: workloads whose process was started more than once (read from the notes they leave).

Progress goes to stdout; the last line is one JSON object.

    python benchmarks/failover.py              # 20 rounds
    python benchmarks/failover.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.conftest import wait_for
from tests.e2e.postgres import Postgres
from tests.ha.replicas import Replicas, Storm

from gpupool.models.schemas import ProjectCreate

COUNTS = ("acknowledged", "retries", "lost", "duplicated", "started_twice")


def one_round(r: Replicas, k: int, args: argparse.Namespace, rng: random.Random) -> dict[str, float | int | None]:
    leader = r.leader()
    epoch = r.lease()[0]  # type: ignore[index]
    prefix = f"r{k}-"
    storm = Storm([s.url for s in r.servers], r.admin_token, args.storm, args.pace, prefix, args.work).start()
    time.sleep(rng.uniform(0.0, args.window))
    pending_at_kill = {n for n in _states(r, prefix, ("pending",))}
    killed = time.monotonic()
    leader.kill()
    new = r.wait_for_new_leader(epoch, 60)
    takeover = time.monotonic() - killed
    first_start: float | None = None
    if pending_at_kill:
        wait_for(lambda: _states(r, prefix, ("running", "succeeded")) & pending_at_kill, 60, "a start after the kill")
        first_start = time.monotonic() - killed
    storm.join(120)
    leader.start()  # back, as a standby
    wait_for(lambda: len(_states(r, prefix, ("succeeded",))) == len(set(storm.acknowledged)), 300, "the round's end")
    names = r.names()
    ours = {n: c for n, c in names.items() if n.startswith(prefix)}
    lost = sum(1 for n in set(storm.acknowledged) if n not in ours)
    duplicated = sum(1 for c in ours.values() if c > 1)
    with new.client() as c:
        ids = [w.id for w in c.list_workloads(project="ha") if w.name.startswith(prefix)]
    twice = sum(1 for i in ids if r.starts(i) > 1)
    out: dict[str, float | int | None] = {
        "round": k,
        "takeover_s": round(takeover, 2),
        "first_start_s": None if first_start is None else round(first_start, 2),
        "acknowledged": len(set(storm.acknowledged)),
        "retries": storm.retries,
        "lost": lost,
        "duplicated": duplicated,
        "started_twice": twice,
    }
    print(json.dumps(out), flush=True)
    return out


def _states(r: Replicas, prefix: str, states: tuple[str, ...]) -> set[str]:
    with r.alive().client() as c:
        return {w.name for w in c.list_workloads(project="ha") if w.name.startswith(prefix) and w.state in states}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--storm", type=int, default=30, help="submits per round")
    ap.add_argument("--pace", type=float, default=0.02, help="seconds between one client's submits")
    ap.add_argument("--window", type=float, default=1.0, help="the kill comes within this many seconds of the storm")
    ap.add_argument("--work", type=float, default=1.0, help="seconds each workload runs")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="gpupool-failover-"))
    pg_root = Path(tempfile.mkdtemp(prefix="gpupool-pg-"))  # not under a private dir: PostgreSQL runs as its own user
    pg = Postgres(pg_root)
    pg.start()
    rounds: list[dict[str, float | int | None]] = []
    try:
        r = Replicas.start(root, pg.new_database(), 2, "fake:8xH100-80GB")
        try:
            with r.alive().client() as c:
                c.create_project(ProjectCreate(name="ha", deserved_gpus=8))
            for k in range(1, args.rounds + 1):
                rounds.append(one_round(r, k, args, rng))
        finally:
            r.close()
    finally:
        pg.stop()
        shutil.rmtree(pg_root, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    takeovers = [float(x["takeover_s"] or 0) for x in rounds]
    starts = [float(x["first_start_s"]) for x in rounds if x["first_start_s"] is not None]
    result = {
        "benchmark": "failover",
        "rounds": len(rounds),
        "storm": args.storm,
        "lease_ttl_s": 10.0,
        "takeover_p50_s": round(statistics.median(takeovers), 2),
        "takeover_max_s": round(max(takeovers), 2),
        "first_start_p50_s": round(statistics.median(starts), 2) if starts else None,
        "first_start_max_s": round(max(starts), 2) if starts else None,
        **{key: sum(int(x[key] or 0) for x in rounds) for key in COUNTS},
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
