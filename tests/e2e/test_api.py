"""Who may do what, bad input refused with a reason and nothing written, and the API's contracts."""

from __future__ import annotations

import subprocess

import httpx
import pytest

from gpupool.client import ApiError
from gpupool.models.schemas import WorkloadCreate
from tests.e2e.conftest import GPUPOOL, Server, wait_for


def _tokens(s: Server) -> dict[str, str]:
    return {
        "alice": s.json("user", "create", "alice", "--project", "vision")["token"],
        "bob": s.json("user", "create", "bob", "--project", "nlp")["token"],
        "vic": s.json("user", "create", "vic", "--role", "viewer", "--project", "vision")["token"],
    }


def test_every_call_needs_a_token_and_members_see_only_their_projects(org_server: Server) -> None:
    s = org_server
    t = _tokens(s)
    assert not (s.data_dir / "admin-token").exists()  # the first admin token's file goes once it is used
    assert httpx.get(f"{s.url}/healthz").status_code == 200
    for path in ("/api/v1/workloads", "/api/v1/projects", "/metrics", "/api/v1/nodes"):
        assert httpx.get(s.url + path).status_code == 401
        assert httpx.get(s.url + path, headers={"Authorization": "Bearer gp_forged"}).status_code == 401
    s.cli("submit", "-p", "vision", "--name", "secret", "--", "sleep", "30", token=t["alice"])
    # Another project's workload does not exist for bob; alice and the viewer see it.
    with pytest.raises(ApiError) as e:
        s.client(t["bob"]).describe("secret")
    assert e.value.status == 404
    assert s.client(t["bob"]).list_workloads() == []
    assert [w.name for w in s.client(t["vic"]).list_workloads()] == ["secret"]
    for who, status in (("bob", 404), ("vic", 403)):  # another tenant's: not found; a denied role: forbidden
        with pytest.raises(ApiError) as e:
            s.client(t[who]).cancel("secret")
        assert e.value.status == status
    denied = s.cli("submit", "-p", "vision", "--", "true", token=t["vic"], check=False)
    assert denied.returncode == 1 and "viewer" in denied.stderr
    assert s.cli("submit", "-p", "vision", "--", "true", token=t["bob"], check=False).returncode == 1
    # Only admins manage the organisation.
    refused = s.cli("project", "create", "mine", token=t["alice"], check=False)
    assert refused.returncode == 1 and "admin" in refused.stderr
    assert [p["name"] for p in s.json("project", "list", token=t["alice"])] == ["vision"]
    assert s.cli("user", "list", token=t["alice"], check=False).returncode == 1


IMPOSSIBLE = [
    (["--gpus", "5", "--", "true"], "no node has more than 4"),
    (["--gpu", "1.5", "--", "true"], "not a fraction"),
    (["--gpu", "0", "--", "true"], "not a fraction"),
    (["--gpu-memory", "100GiB", "--", "true"], "no device has more than"),
    (["--gpu-memory", "lots", "--", "true"], "expected a size"),
    (["--name", "Not_DNS", "--", "true"], "DNS-safe"),
    (["--priority", "urgent", "--", "true"], "expected one of production, training, interactive, batch"),
    (["--gpus", "3", "--no-preemptible", "--", "true"], "not preemptible"),
    (["--env", "CUDA_VISIBLE_DEVICES=0", "--", "true"], "set by gpupool"),
    (["--env", "NOEQUALS", "--", "true"], "KEY=VALUE"),
    (["--type", "training"], "needs a command"),
    (["--workers", "3", "--gpus", "2", "--", "true"], "cannot hold them all"),
    (["--gpus", "1", "--gpu", "0.5", "--", "true"], "one of"),
]


def test_impossible_requests_are_refused_at_submit_and_nothing_is_written(org_server: Server) -> None:
    s = org_server
    for args, reason in IMPOSSIBLE:
        done = s.cli("submit", "-p", "vision", *args, check=False)
        assert done.returncode != 0 and reason in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
    assert s.json("list") == []


# Refused before the store is written (validation, the CLI's YAML), and the CLI's own file below: SQLite only.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_unknown_projects_pools_fields_and_bad_yaml_are_refused(org_server: Server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    s = org_server
    c = s.client()
    with pytest.raises(ApiError) as e:
        c.submit(WorkloadCreate(project="nope", command=["true"]))
    assert e.value.status == 404
    with pytest.raises(ApiError) as e:
        c.submit(WorkloadCreate(project="vision", command=["true"], pools=["tpu"]))
    assert e.value.status == 422 and "unknown pool" in e.value.reason
    raw = httpx.post(
        f"{s.url}/api/v1/workloads",
        json={"project": "vision", "command": ["true"], "colour": "red"},
        headers={"Authorization": f"Bearer {s.admin_token}"},
    )
    assert raw.status_code == 422 and "colour" in raw.text
    bad = tmp_path / "bad.yaml"
    bad.write_text("project: vision\ncommand: [unclosed\n")
    done = s.cli("apply", "-f", str(bad), check=False)
    assert done.returncode == 2 and "not valid YAML" in done.stderr
    odd = tmp_path / "odd.yaml"
    odd.write_text("project: vision\ngpus: many\ncommand: [true]\n")
    done = s.cli("apply", "-f", str(odd), check=False)
    assert done.returncode == 2 and "gpus" in done.stderr
    good = tmp_path / "good.yaml"
    good.write_text("project: vision\nname: from-yaml\ntype: batch\ngpu-memory: 20GiB\ncommand: [sleep, '30']\n")
    s.cli("apply", "-f", str(good))
    w = s.wait_state("from-yaml", "running")
    assert w["priority"] == "batch" and w["gpu_memory_mib"] == 20480
    assert [x["name"] for x in s.json("list")] == ["from-yaml"]
    again = s.cli("apply", "-f", str(good))
    assert again.stdout == f"workload from-yaml unchanged (id {w['id']}, running)\n"
    good.write_text(good.read_text().replace("'30'", "'40'"))
    changed = s.cli("apply", "-f", str(good), check=False)
    assert (changed.returncode, changed.stdout) == (1, "")
    assert changed.stderr == (
        "error: 'from-yaml' runs another spec (command: ['sleep', '30'] → ['sleep', '40']); apply with force to "
        f"replace it\n(`gpupool apply -f {good} --force` replaces it)\n"
    )
    forced = s.cli("apply", "-f", str(good), "--force")
    new = s.workload("from-yaml")
    assert forced.stdout == f"workload from-yaml replaced: id {w['id']} stopped, id {new['id']} pending\n"
    assert new["command"] == ["sleep", "40"]
    # A retry key in the file makes applying it twice submit once (issue 15: the field used to be refused).
    keyed = tmp_path / "keyed.yaml"
    keyed.write_text("project: vision\nname: keyed\nidempotency_key: nightly-1\ncommand: [sleep, '30']\n")
    first, again = s.json("apply", "-f", str(keyed)), s.json("apply", "-f", str(keyed))
    assert (first["id"], first["name"]) == (again["id"], "keyed")


def test_idempotent_submits_pagination_metrics_and_operation_ids(org_server: Server) -> None:
    s = org_server
    c = s.client()
    body = WorkloadCreate(project="nlp", name="once", command=["sleep", "30"], gpu=0.5)
    first = c.submit(body, idempotency_key="k-1")
    again = c.submit(body, idempotency_key="k-1")
    assert first.id == again.id
    for i in range(5):
        c.submit(WorkloadCreate(project="vision", name=f"p{i}", command=["true"]))
    page = httpx.get(
        f"{s.url}/api/v1/workloads", params={"limit": 2}, headers={"Authorization": f"Bearer {s.admin_token}"}
    ).json()
    assert len(page["items"]) == 2 and page["next_cursor"]
    assert len(c.list_workloads(limit=2)) == 6
    s.wait_state("once", "running")
    metrics = wait_for(lambda: next((m for m in [c.metrics()] if 'project="nlp"} 0.5' in m), None), what="metrics")
    assert 'gpupool_device_allocated_ratio{device="0"' in metrics
    assert "gpupool_queue_depth" in metrics and "gpupool_scheduler_cycles" in metrics
    spec = httpx.get(f"{s.url}/openapi.json").json()
    ops = {op["operationId"] for path in spec["paths"].values() for op in path.values()}
    assert {"submit_workload", "list_workloads", "describe_workload", "cancel_workload", "workload_logs"} <= ops


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_login_saves_the_connection_privately_and_whoami_reads_it(org_server: Server) -> None:
    s = org_server
    token = s.json("user", "create", "carol", "--project", "nlp")["token"]
    env_less = s.env | {"XDG_CONFIG_HOME": str(s.root / "carol")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([GPUPOOL, *args], env=env_less, capture_output=True, text=True, timeout=60, cwd=s.cwd)

    assert run("list").returncode == 1  # not logged in: a message, not a traceback
    assert "gpupool login" in run("list").stderr
    wrong = run("login", "--url", s.url, "--token", "gp_wrong")
    assert wrong.returncode == 1 and "bearer token" in wrong.stderr
    assert run("login", "--url", s.url, "--token", token).returncode == 0
    saved = s.root / "carol" / "gpupool" / "config.json"
    assert saved.stat().st_mode & 0o777 == 0o600
    assert run("whoami").stdout.strip() == "carol (member); projects: nlp"
    # With one project, -p is not needed.
    assert run("submit", "--name", "mine", "--", "true").returncode == 0
    assert s.workload("mine")["project"] == "nlp"
