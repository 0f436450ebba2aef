"""The scheduler seen through the product: fractions, reclaim and gangs on a real server with simulated GPUs."""

from __future__ import annotations

from collections.abc import Callable

from tests.e2e.conftest import Server, wait_for

SPIN = ["sh", "-c", "trap 'echo got TERM; exit 0' TERM; echo ready; while true; do sleep 0.1; done"]


def test_four_quarter_gpu_workloads_share_a_device_and_a_fifth_waits(make_server: Callable[..., Server]) -> None:
    s = make_server("fake:1xA100-40GB")
    s.cli("project", "create", "lab", "--deserved-gpus", "1")
    for i in range(5):
        s.cli("submit", "-p", "lab", "--name", f"q{i}", "--gpu", "0.25", "--", *SPIN)
    for i in range(4):
        w = s.wait_state(f"q{i}", "running")
        assert w["devices"] == [0]
    fifth = wait_for(lambda: s.workload("q4")["reason_code"], what="a reason for q4")
    assert fifth == "no-node-fits"
    assert s.workload("q4")["state"] == "pending"
    (device,) = s.json("nodes")[0]["devices"]
    assert device["allocated_milli"] == 1000 and sorted(device["workloads"]) == ["q0", "q1", "q2", "q3"]
    detail = s.workload("q0")
    assert detail["fraction"] == "advisory"  # no MPS on a host without GPUs
    s.cli("cancel", "q1")
    s.wait_state("q1", "cancelled")
    s.wait_state("q4", "running")


def test_a_borrowing_project_is_reclaimed_when_its_neighbour_submits(org_server: Server) -> None:
    s = org_server
    for i in range(4):
        s.cli("submit", "-p", "vision", "--type", "batch", "--name", f"b{i}", "--gpus", "1", "--", *SPIN)
    for i in range(4):
        s.wait_state(f"b{i}", "running")
        wait_for(lambda n=i: "ready" in s.cli("logs", f"b{n}").stdout, what=f"b{i} to set its trap")
    s.cli("submit", "-p", "nlp", "--name", "mine", "--gpus", "1", "--", *SPIN)
    s.wait_state("mine", "running")
    vision = [w for w in s.json("list", "-p", "vision")]
    preempted = [w for w in vision if w["state"] == "preempted"]
    assert len(preempted) == 1 and [w["state"] for w in vision].count("running") == 3
    victim = s.workload(preempted[0]["name"])
    # Named by its project, not its name: the victim's readers are another tenant.
    reclaims = [e["reason"] for e in victim["events"] if e["code"] == "stop-requested"]
    assert reclaims == ["reclaim: reclaimed for a workload of project nlp, which is below its fair share; stopping"]
    assert victim["reason_code"] in ("no-node-fits", "over-limit", None) or victim["state"] == "preempted"
    # The victim was asked to stop, not killed: its trap ran within the grace period.
    out = s.cli("logs", preempted[0]["name"]).stdout
    assert "got TERM" in out


def test_a_gang_starts_whole_and_its_members_see_the_torchrun_variables(org_server: Server) -> None:
    s = org_server
    s.cli("submit", "-p", "nlp", "--name", "blocker", "--gpus", "1", "--", *SPIN)
    s.wait_state("blocker", "running")
    printenv = "echo rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE "
    printenv += "master=$MASTER_ADDR:$MASTER_PORT cuda=$CUDA_VISIBLE_DEVICES; sleep 30"
    s.cli("submit", "-p", "vision", "--name", "ddp", "--workers", "2", "--gpus", "2", "--", "sh", "-c", printenv)
    reason = wait_for(lambda: s.workload("ddp")["reason_code"], what="a reason for the gang")
    # vision (deserved 2) asks 4 of the 4 GPUs while nlp holds one within its quota: only idle GPUs could take
    # the gang past vision's deserved quota and fair share, and there are 3.
    assert reason == "over-deserved"
    assert s.workload("ddp")["allocations"] == []  # all or nothing: no member started alone
    s.cli("cancel", "blocker")
    s.wait_state("ddp", "running")
    lines = []
    for rank in (0, 1):
        out = wait_for(lambda r=rank: s.cli("logs", "ddp", "--rank", str(r)).stdout.strip(), what=f"rank {rank}")
        lines.append(out)
    fields = [dict(kv.split("=", 1) for kv in line.split()) for line in lines]
    assert [f["rank"] for f in fields] == ["0", "1"]
    assert all(f["world"] == "2" and f["local"] == f"{f['rank']}/2" for f in fields)
    assert fields[0]["master"] == fields[1]["master"] and fields[0]["master"].startswith("127.0.0.1:")
    devices = [set(f["cuda"].split(",")) for f in fields]
    assert all(len(d) == 2 for d in devices) and not devices[0] & devices[1]
