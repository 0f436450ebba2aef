"""From inside a running workload (a notebook's terminal, a training script), `gpupool submit` works without a
login: each launch gets its own token, with its owner's rights in its project at most, revoked when it ends."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Server, wait_for
from tests.e2e.envs import OPT, environment

CLIENT = OPT / "client"
"""gpupool installed as a user would (not editable: a workload's sandbox sees the test environment, read-only, and
not the checkout), inside the test environment."""
GPUPOOL = CLIENT / "bin" / "gpupool"

# Submits a child job to its own project, tries another project, and keeps its token where the test can read it.
PARENT = f"""
echo "$GPUPOOL_TOKEN" > token
{GPUPOOL} submit --no-code --name child -- true > submitted 2>&1; echo "rc=$?" >> submitted
{GPUPOOL} submit --no-code -p other --name sneaky -- true > refused 2>&1; echo "rc=$?" >> refused
{GPUPOOL} token create escape > minted 2>&1; echo "rc=$?" >> minted
exec sleep 300
"""


@pytest.fixture(scope="module")
def client_env() -> Path:
    environment("client", checkout="")
    return GPUPOOL


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_workload_submits_as_its_owner_in_its_project_only_until_it_ends(
    make_server: Callable[..., Server], client_env: Path
) -> None:
    s = make_server("fake:2xH100-80GB")
    s.cli("project", "create", "vision", "--deserved-gpus", "1")
    s.cli("project", "create", "other", "--deserved-gpus", "1")
    ana = s.json("user", "create", "ana", "--project", "vision", "--project", "other")["token"]
    s.cli("submit", "-p", "vision", "--name", "parent", "--no-code", "--", "sh", "-c", PARENT, token=ana)
    parent = s.wait_state("parent", "running", timeout=60)
    workdir = s.data_dir / "workloads" / str(parent["id"])
    for name in ("submitted", "refused", "minted"):
        wait_for(lambda name=name: "rc=" in ((workdir / name).read_text() if (workdir / name).exists() else ""),
                 60, f"the parent's {name}")  # fmt: skip
    assert (workdir / "submitted").read_text().endswith("rc=0\n")
    child = s.workload("child", token=ana)
    assert (child["project"], child["owner"]) == ("vision", "ana")
    # Its token reaches its own project only, though its owner is a member of both, and mints no token.
    assert (workdir / "refused").read_text() == "error: no project named 'other'\nrc=1\n"
    assert (workdir / "minted").read_text() == (
        "error: a workload's own token cannot make tokens: it ends with the workload\nrc=1\n"
    )

    token = (workdir / "token").read_text().strip()
    assert token.startswith("gpw_")
    me = httpx.get(f"{s.url}/api/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    assert (me.status_code, me.json()["name"]) == (200, "ana")
    s.cli("cancel", "parent", token=ana)
    s.wait_state("parent", "cancelled", timeout=60)

    def refused() -> bool:  # the server remembers a token's owner a few seconds
        r = httpx.get(f"{s.url}/api/v1/whoami", headers={"Authorization": f"Bearer {token}"})
        return r.status_code == 401

    wait_for(refused, 30, "the ended workload's token to be refused")
    forged = token[:-4] + ("0000" if not token.endswith("0000") else "1111")
    r = httpx.get(f"{s.url}/api/v1/whoami", headers={"Authorization": f"Bearer {forged}"})
    assert r.status_code == 401
