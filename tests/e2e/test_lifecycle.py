"""Cancel, logs, the grace period, apps that serve a port, and a server restart that keeps everything."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.e2e.conftest import Server, wait_for
from tests.e2e.jupyter import run_in_kernel

IGNORE_TERM = ["sh", "-c", "trap 'echo ignoring TERM' TERM; echo started; while true; do sleep 0.1; done"]


def test_logs_follow_until_the_workload_ends(org_server: Server) -> None:
    s = org_server
    s.cli("submit", "-p", "vision", "--name", "counter", "--", "sh", "-c", "for i in 1 2 3; do echo line $i; done")
    out = s.cli("logs", "counter", "-f").stdout
    assert out.splitlines() == ["line 1", "line 2", "line 3"]
    assert s.workload("counter")["state"] == "succeeded"
    s.cli("submit", "-p", "vision", "--name", "broken", "--", "sh", "-c", "exit 3")
    w = s.wait_state("broken", "failed")
    assert w["exit_code"] == 3 and "code 3" in w["reason"]
    s.cli("submit", "-p", "vision", "--name", "missing", "--", "/no/such/program")
    assert s.wait_state("missing", "failed")["exit_code"] == 127


def test_cancel_sends_term_then_kills_after_the_grace_period(org_server: Server) -> None:
    s = org_server
    s.cli("submit", "-p", "vision", "--name", "stubborn", "--grace", "4", "--", *IGNORE_TERM)
    s.wait_state("stubborn", "running")
    wait_for(lambda: "started" in s.cli("logs", "stubborn").stdout, what="the workload to print")
    assert s.client().cancel("stubborn").state == "running"  # asked to stop; it has its grace period
    w = s.wait_state("stubborn", "cancelled", timeout=20)
    assert "ignoring TERM" in s.cli("logs", "stubborn").stdout
    assert w["finished_at"] - max(e["at"] for e in w["events"] if "stopping" in e["reason"]) >= 4.0
    again = s.cli("cancel", "stubborn", check=False)
    assert again.returncode == 1 and "already ended" in again.stderr
    # Pending work is cancelled at once.
    s.cli("submit", "-p", "vision", "--name", "too-big-now", "--gpus", "4", "--no-preemptible", check=False)
    s.cli("submit", "-p", "vision", "--name", "queued", "--gpus", "4", "--", "true")
    s.cli("submit", "-p", "nlp", "--name", "hog", "--gpus", "1", "--", *IGNORE_TERM)
    s.wait_state("hog", "running")


def test_an_inference_service_is_healthy_once_it_answers(org_server: Server) -> None:
    s = org_server
    serve = ["sh", "-c", 'sleep 1; exec python3 -m http.server "$PORT" --bind 127.0.0.1']
    s.cli("submit", "-p", "vision", "--name", "api", "--type", "inference", "--gpu", "0.5", "--", *serve)
    w = s.workload("api")
    assert w["priority"] == "production" and w["preemptible"] is False
    s.wait_state("api", "running")
    url = s.cli("open", "api").stdout.strip()
    assert url == f"{s.url}/apps/vision/api/"
    assert httpx.get(url, headers={"Authorization": f"Bearer {s.admin_token}"}, timeout=5).status_code == 200
    assert httpx.get(url, timeout=5).status_code == 401
    # Its clients use an API key made for it: it opens this service and nothing else, until revoked.
    key = s.json("token", "create", "clients", "-p", "vision", "--app", "api")
    with_key = {"Authorization": f"Bearer {key['token']}"}
    assert key["token"].startswith("gpk_") and key["kind"] == "apikey"
    assert httpx.get(url, headers=with_key, timeout=5).status_code == 200
    assert httpx.get(f"{s.url}/api/v1/whoami", headers=with_key, timeout=5).status_code == 401
    s.cli("token", "revoke", str(key["id"]))
    assert httpx.get(url, headers=with_key, timeout=5).status_code == 401
    training = s.cli("open", "api-missing", check=False)
    assert training.returncode == 1


def test_a_restarted_server_keeps_its_workloads_and_adopts_their_processes(org_server: Server) -> None:
    s = org_server
    s.cli(
        "submit",
        "-p",
        "vision",
        "--name",
        "long",
        "--gpus",
        "1",
        "--",
        "sh",
        "-c",
        "while true; do sleep 0.1; done",
    )
    s.cli("submit", "-p", "nlp", "--name", "short", "--", "sh", "-c", "while [ ! -e go ]; do sleep 0.05; done; exit 7")
    s.cli("submit", "-p", "nlp", "--name", "waiting", "--gpus", "4", "--", "true")
    s.wait_state("long", "running")
    short = s.wait_state("short", "running")
    long = s.workload("long")
    pid = int(json.loads((s.data_dir / "run" / f"{long['id']}-0-0.json").read_text())["pid"])
    s.kill()  # as in a crash: no chance to clean up
    os.kill(pid, 0)  # the workload outlived its server
    (s.data_dir / "workloads" / str(short["id"]) / "go").touch()  # `short` ends while the server is down
    wait_for(lambda: any((s.data_dir / "run").glob("*.exit")), 10, "short to end")
    s.start()
    assert s.workload("long")["state"] == "running"
    # Its exit status was kept for the server to find.
    assert s.wait_state("short", "failed")["exit_code"] == 7
    assert s.workload("waiting")["state"] == "pending"
    assert [w["name"] for w in s.json("list", "--state", "running")] == ["long"]
    s.cli("cancel", "long")
    s.wait_state("long", "cancelled")
    wait_for(lambda: not _alive(pid), 10, "the adopted process to be gone")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_notebook_is_a_real_jupyterlab_that_only_its_members_reach_through_the_proxy(
    make_server: Callable[..., Server],
) -> None:
    s = make_server("fake:1xH100-80GB")
    s.cli("project", "create", "lab", "--deserved-gpus", "1")
    s.cli("project", "create", "other", "--deserved-gpus", "0")
    member = s.json("user", "create", "ana", "--project", "lab")["token"]
    viewer = s.json("user", "create", "vic", "--role", "viewer", "--project", "lab")["token"]
    outsider = s.json("user", "create", "olga", "--project", "other")["token"]
    s.cli("submit", "-p", "lab", "--type", "notebook", "--name", "nb", "--gpu", "0.25", token=member)
    w = s.wait_state("nb", "running", timeout=90)
    assert w["priority"] == "interactive"
    base = s.cli("open", "nb", token=member).stdout.strip()
    assert base == f"{s.url}/apps/lab/nb/"
    assert s.cli("open", "nb", token=viewer).stdout.strip() == base  # the address is no secret; access is

    def status(token: str | None) -> int:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(base + "api/status", headers=headers, timeout=10).status_code

    assert status(None) == 401
    assert status("gp_wrong") == 401
    assert status(viewer) == 403
    assert status(outsider) == 404
    ok = httpx.get(base + "api/status", headers={"Authorization": f"Bearer {member}"}, timeout=10)
    assert ok.status_code == 200 and "started" in ok.json()
    # Code runs in a kernel reached over the proxied websocket, and writes into the notebook's workdir.
    run_in_kernel(base, member, "open('from-kernel.txt', 'w').write('hi')")
    workdir = s.data_dir / "workloads" / str(w["id"])
    wait_for(lambda: (workdir / "from-kernel.txt").exists(), 30, "the kernel's file")
    assert (workdir / "from-kernel.txt").stat().st_uid == workdir.stat().st_uid != os.geteuid()
    with pytest.raises(InvalidStatus) as refused, connect(base.replace("http://", "ws://") + "api/events/subscribe"):
        pass
    assert refused.value.response.status_code == 403  # an unauthenticated upgrade never reaches Jupyter
    s.cli("cancel", "nb", token=member)
    assert s.wait_state("nb", "cancelled", timeout=30)["state"] == "cancelled"
