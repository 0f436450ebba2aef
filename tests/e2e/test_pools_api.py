"""Pool settings on a real server: anyone reads them, only admins change them, and the scheduler follows them."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from gpupool.client import ApiError
from gpupool.models.system import PoolPublic, PoolUpdate
from tests.e2e.conftest import Server, wait_for

SPIN = ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.1; done"]
DEFAULT = PoolPublic(name="default", nodes=1, gpus=4, share_across_projects=False, updated_at=None)


def test_anyone_reads_pools_and_only_an_admin_changes_them(org_server: Server) -> None:
    s = org_server
    alice = s.json("user", "create", "alice", "--project", "vision")["token"]
    assert s.client(alice).list_pools() == [DEFAULT]

    with pytest.raises(ApiError) as refused:
        s.client(alice).update_pool("default", PoolUpdate(share_across_projects=True))
    assert (refused.value.status, refused.value.reason) == (403, "only an admin may do this")
    assert s.client().list_pools() == [DEFAULT]  # nothing changed
    denied = s.cli("pool", "set", "default", "--share-across-projects", token=alice, check=False)
    assert (denied.returncode, denied.stderr.strip()) == (1, "error: only an admin may do this")

    changed = s.client().update_pool("default", PoolUpdate(share_across_projects=True))
    assert changed.share_across_projects is True
    assert changed.updated_at is not None
    assert s.client(alice).list_pools() == [changed]

    headers = {"Authorization": f"Bearer {s.admin_token}"}
    extra = httpx.patch(
        f"{s.url}/api/v1/pools/default", json={"share_across_projects": False, "colour": "red"}, headers=headers
    )
    assert extra.status_code == 422
    assert [i["loc"] for i in extra.json()["detail"]] == [["body", "colour"]]
    not_bool = httpx.patch(f"{s.url}/api/v1/pools/default", json={"share_across_projects": "no"}, headers=headers)
    assert not_bool.status_code == 422
    assert s.client().list_pools() == [changed]  # neither refusal changed anything

    with pytest.raises(ApiError) as unknown:
        s.client().update_pool("nowhere", PoolUpdate(share_across_projects=True))
    assert (unknown.value.status, unknown.value.reason) == (404, "no pool 'nowhere': no node names it")
    assert [p.name for p in s.client().list_pools()] == ["default"]

    out = s.json("pool", "set", "default", "--no-share-across-projects")
    assert (out["name"], out["share_across_projects"]) == ("default", False)
    assert [(p["name"], p["share_across_projects"]) for p in s.json("pool", "list")] == [("default", False)]


def test_a_fraction_waits_beside_another_projects_until_the_pool_allows_sharing(
    make_server: Callable[..., Server],
) -> None:
    s = make_server("fake:1xH100-80GB")
    s.cli("project", "create", "vision", "--deserved-gpus", "0.5")
    s.cli("project", "create", "nlp", "--deserved-gpus", "0.5")
    s.cli("submit", "-p", "vision", "--name", "va", "--gpu", "0.5", "--", *SPIN)
    assert s.wait_state("va", "running")["devices"] == [0]
    s.cli("submit", "-p", "nlp", "--name", "nb", "--gpu", "0.5", "--", *SPIN)
    code = wait_for(lambda: s.workload("nb")["reason_code"], what="a reason for nb")
    assert code == "no-shareable-device"
    nb = s.workload("nb")
    assert nb["state"] == "pending"
    assert nb["reason"] == (
        "it fits only on devices that other projects' shares hold, and pool default does not share a device "
        "across projects"
    )
    assert "no-shareable-device" in s.cli("describe", "nb").stdout

    s.cli("pool", "set", "default", "--share-across-projects")
    assert s.wait_state("nb", "running")["devices"] == [0]
    assert s.workload("va")["state"] == "running"
