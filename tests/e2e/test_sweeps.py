"""A hyperparameter sweep end to end on the local backend (simulated GPUs), on SQLite and PostgreSQL: 12 trials of a
toy objective, 3 at a time, a median pruner; the server is killed mid-sweep and started again."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import yaml

from tests.e2e.conftest import Server, wait_for
from tests.e2e.sweeps import most_at_once, trials_said

# (x - 2)² at the end; each step reports it plus what is left to go, so a trial far from 2 looks bad from its
# first steps on, and the median pruner stops it.
OBJECTIVE = """
import sys, time
x = float(sys.argv[1])
loss = (x - 2) ** 2
for step in range(6):
    print(f"gpupool.report step={step} value={loss + 6 - step}", flush=True)
    time.sleep(0.4)
print(f"gpupool.result value={loss}", flush=True)
"""
SWEEP = {
    "name": "search",
    "project": "vision",
    "command": [sys.executable, "-c", OBJECTIVE, "{x}"],
    "space": {"x": {"type": "float", "low": -10, "high": 10}},
    "metric": "loss",
    "direction": "minimize",
    "trials": 12,
    "parallelism": 3,
    "sampler": {"kind": "random", "seed": 6},
    "pruner": {"kind": "median", "n_startup_trials": 2, "n_warmup_steps": 1},
    "gpus": 1,
}
FINISHED = {"complete", "pruned", "fail"}


def _sweep(s: Server) -> dict[str, Any]:
    return dict(s.json("sweep", "describe", "search", "-p", "vision"))


def test_a_sweep_runs_its_trials_three_at_a_time_prunes_the_bad_ones_and_survives_a_restart(
    make_server: Callable[..., Server],
) -> None:
    s = make_server("fake:4xH100-80GB")
    s.kill()
    s.env["GPUPOOL_SWEEP_INTERVAL_S"] = "0.2"
    s.start()
    s.cli("project", "create", "vision", "--deserved-gpus", "4")
    spec = s.cwd / "sweep.yaml"
    spec.write_text(yaml.safe_dump(SWEEP))
    started = s.cli("sweep", "-f", str(spec)).stdout
    assert started == "sweep vision/search started: 12 trials, 3 at a time\n"

    def finished(at_least: int) -> bool:
        return sum(1 for t in _sweep(s)["trial_list"] if t["state"] in FINISHED) >= at_least

    wait_for(lambda: finished(4), 120, "four trials to finish")
    before = {t["number"]: (t["state"], t["value"]) for t in _sweep(s)["trial_list"] if t["state"] in FINISHED}
    s.kill()  # mid-sweep: its running trials run on, and are adopted
    s.start()
    done = wait_for(lambda: finished(12) and (d := _sweep(s))["state"] == "succeeded" and d, 240, "the sweep to end")

    def said() -> str:  # only where an assertion fails: it asks the server about every trial's workload
        return trials_said(s, "search")

    trials = done["trial_list"]
    # Never more than its parallelism, though 4 GPUs were free.
    assert most_at_once(s, [t["workload"] for t in trials]) == 3, said()
    assert [t["number"] for t in trials] == list(range(12)), said()
    assert {t["number"]: (t["state"], t["value"]) for t in trials if t["number"] in before} == before, said()
    states = [t["state"] for t in trials]
    assert set(states) == {"complete", "pruned"} and states.count("complete") + states.count("pruned") == 12, said()
    # A pruned trial stopped before its last step, its workload cancelled (its GPU freed at once); a completed one's
    # value is its result line, not its last report.
    workloads = {w["name"]: w for w in s.json("list", "-p", "vision")}
    for t in trials:
        if t["state"] == "pruned":
            assert t["last_step"] < 5 and workloads[t["workload"]]["state"] == "cancelled", f"{t}\n{said()}"
            assert t["reason"] == f"pruned at step {t['last_step']}; its workload was stopped", said()
        else:
            assert t["last_step"] == 5 and workloads[t["workload"]]["state"] == "succeeded", f"{t}\n{said()}"
            assert (t["value"], t["reason"]) == ((t["params"]["x"] - 2) ** 2, None), f"{t}\n{said()}"
    # The best is the completed trial closest to the optimum x = 2, within the draws' reach.
    completed = [t for t in trials if t["state"] == "complete"]
    nearest = min(completed, key=lambda t: abs(t["params"]["x"] - 2))
    assert done["best"]["number"] == nearest["number"], said()
    assert abs(done["best"]["params"]["x"] - 2) < 0.5, said()
    assert done["best"]["value"] == (done["best"]["params"]["x"] - 2) ** 2, said()
    plot = s.cwd / "history.png"
    table = s.cli("sweep", "describe", "search", "-p", "vision", "--plot", str(plot)).stdout
    assert f"Best:       trial {nearest['number']}: " in table
    assert table.endswith(f"plot written to {plot}\n")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000
