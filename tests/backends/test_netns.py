"""A workload's network on a host with no route out (gpupool.backends.local.netns): pasta has nothing to NAT to
there and refuses to start, which used to fail every sandboxed launch. The server's own code is run in a network
namespace with a loopback only, as on an air-gapped host."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpupool.backends.local.netns import Networks, sweep

# Its loopback up: a listener there takes a connection.
LOOPBACK = (
    "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
    "socket.create_connection(s.getsockname(), timeout=2).close(); print('loopback up')"
)


def test_a_host_with_no_route_out_gives_members_their_loopback_and_no_nat(tmp_path: Path) -> None:
    root = tmp_path / "netns"
    make = f"from pathlib import Path; from gpupool.backends.local.netns import Networks; " \
           f"print(Networks(Path({str(root)!r}), (8470,)).ensure('7-0-0'))"  # fmt: skip
    done = subprocess.run(["unshare", "--net", sys.executable, "-c", make], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, f"{root / '7-0'}\n"), done.stderr
    assert "this host has no route out: workload networks have no way out" in done.stderr
    assert sorted(p.name for p in root.iterdir()) == ["7-0", "7-0.resolv"]  # no NAT, no pid file
    inside = subprocess.run(["nsenter", f"--net={root / '7-0'}", sys.executable, "-c", LOOPBACK],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert inside.stdout == "loopback up\n", inside.stderr
    Networks(root, ()).release("7-0-1")  # any member of the attempt: unmounted, its empty file left for a sweep
    assert sorted(p.name for p in root.iterdir()) == ["7-0"] and (root / "7-0").stat().st_size == 0
    sweep(root)
    assert list(root.iterdir()) == []
