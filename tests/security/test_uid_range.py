"""Two servers on one host never give out the same uids (gpupool.backends.local.uidrange): with the same default
base and different stores, project 1 of each was the same identity, which could signal, trace and read the
other's processes and files."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from gpupool.backends.local import uidrange
from gpupool.backends.local.uidrange import SPAN, RangeTaken, claim
from tests.e2e.conftest import GPUPOOL, Server, free_port, wait_for

BASE = 300_000_000  # in no range the test run hands out (tests/uids.py)


def test_an_overlapping_range_is_refused_while_its_server_lives_or_anything_runs_under_it(tmp_path: Path) -> None:
    registry, a, b = tmp_path / "registry", tmp_path / "a", tmp_path / "b"
    held = claim(a, BASE, registry)
    with pytest.raises(RangeTaken) as refused:
        claim(b, BASE + SPAN // 2, registry)
    assert str(refused.value) == (
        f"uids {BASE + SPAN // 2}-{BASE + SPAN // 2 + SPAN - 1} overlap {BASE}-{BASE + SPAN - 1}, given out by the "
        f"gpupool server on {a}: two servers with different projects would share identities. Give this one a "
        f"range of its own (--uid-base {BASE + SPAN // 2 + SPAN}), or use that server's data directory"
    )
    os.close(claim(b, BASE + SPAN, registry))  # the next range is free
    os.close(claim(a, BASE, registry))  # a replica on the same data dir shares its range
    os.close(held)
    # Its server gone, but a member of one of its projects runs on: still taken.
    uid = BASE + 7
    member = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "60"])
    status = Path(f"/proc/{member.pid}/status")
    wait_for(lambda: f"Uid:\t{uid}\t" in status.read_text(), 10, "the member to run as its uid")
    try:
        with pytest.raises(RangeTaken):
            claim(b, BASE, registry)
    finally:
        member.send_signal(signal.SIGKILL)
        member.wait()
    # Nothing of it left: its entry is stale and the range is given to the new server.
    os.close(claim(b, BASE, registry))
    assert [p.read_text() for p in registry.glob("*.range")] == [f"{BASE}\n{b}\n"]


def test_a_range_a_host_user_holds_as_subordinate_ids_is_refused(tmp_path: Path) -> None:
    subuid, subgid = tmp_path / "subuid", tmp_path / "subgid"
    subuid.write_text(f"ana:{BASE + 10}:65536\n")
    subgid.write_text("")
    with pytest.raises(RangeTaken) as refused:
        claim(tmp_path / "a", BASE, tmp_path / "registry", (subuid, subgid))
    assert str(refused.value) == (
        f"uids {BASE}-{BASE + SPAN - 1} overlap ana's subordinate ids in {subuid} ({BASE + 10}-{BASE + 10 + 65535}): "
        "that user could act as a project. Give this server another --uid-base"
    )
    os.close(claim(tmp_path / "a", BASE + SPAN * 2, tmp_path / "registry", (subuid, subgid)))


def test_a_registry_another_account_could_change_is_refused(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    registry.mkdir(mode=0o700)
    os.chown(registry, 65534, 65534)  # nobody could unlink live entries, or plant links for root to write through
    with pytest.raises(PermissionError, match=f"^{registry} is not root's alone \\(owner 65534, mode 700\\)$"):
        claim(tmp_path / "a", BASE, registry)
    assert list(registry.iterdir()) == []


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_second_root_server_with_another_store_in_the_same_range_refuses_to_start(
    make_server: Callable[..., Server], tmp_path: Path
) -> None:
    first = make_server("fake:1xH100-80GB")
    cmd = [GPUPOOL, "server", "--data-dir", str(tmp_path / "other"), "--port", str(free_port()),
           "--gpus", "fake:1xH100-80GB", "--uid-base", str(first.uid_base + 10)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=first.env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: uids {first.uid_base + 10}-{first.uid_base + 10 + SPAN - 1} overlap "
        f"{first.uid_base}-{first.uid_base + SPAN - 1}, given out by the gpupool server on {first.data_dir}: two "
        "servers with different projects would share identities. Give this one a range of its own (--uid-base "
        f"{first.uid_base + SPAN + 10}), or use that server's data directory"
    )
    assert uidrange.REGISTRY.is_dir()
