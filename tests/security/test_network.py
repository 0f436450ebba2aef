"""Each local workload has a network of its own (gpupool.backends.local.netns): the exploit was a job reading another
project's notebook kernel on the host's loopback. Proven with the attack itself: a listener of one project's, and
another project's job that tries to reach it, to see it in /proc/net, and to reach the host's loopback; plus what
must still work (the API's port, the way out, a gang's shared loopback, an admin's host-network grant)."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from tests.e2e.conftest import Server, wait_for

SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)

LISTEN = (
    "import socket,time; s=socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); "
    "print('LISTENING', flush=True); time.sleep(600)"
)
# What another job tries: connect to a port, and look for it in /proc/net/tcp (its uid and port in the clear).
PROBE = """
import socket, sys
def reach(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return 'open'
    except OSError as e:
        return type(e).__name__
port = int(sys.argv[1])
for host, p in [('127.0.0.1', port)] + [(h, int(q)) for h, q in (a.split(':') for a in sys.argv[2:])]:
    print('REACH', host, p, reach(host, p), flush=True)
seen = any(int(line.split()[1].split(':')[1], 16) == port for line in open('/proc/net/tcp').readlines()[1:])
print('PROCNET', 'seen' if seen else 'unseen', flush=True)
"""


def _host_address() -> str:
    """The host's address on its network (the route out), where a service bound to every address answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # TEST-NET: no packet is sent by a UDP connect
        return str(s.getsockname()[0])


@pytest.fixture
def host_services() -> Iterator[tuple[int, int]]:
    """Two services of the host's: one on its loopback only (as the server's internals, a database), one on every
    address (as any service the network may reach)."""
    servers = [http.server.ThreadingHTTPServer((addr, 0), http.server.SimpleHTTPRequestHandler)
               for addr in ("127.0.0.1", "0.0.0.0")]  # fmt: skip
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        yield servers[0].server_address[1], servers[1].server_address[1]
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


def _lines(s: Server, name: str, token: str, prefix: str, count: int) -> list[str]:
    def found() -> list[str] | None:
        out = [x for x in s.cli("logs", name, token=token).stdout.splitlines() if x.startswith(prefix)]
        return out if len(out) >= count else None

    return wait_for(found, 60, f"{name}'s {prefix} lines")


@SQLITE
def test_a_job_reaches_no_other_workload_nor_the_hosts_loopback_and_sees_only_its_own_sockets(
    make_server: Callable[..., Server], host_services: tuple[int, int]
) -> None:
    loopback_only, everywhere = host_services
    s = make_server("fake:2xH100-80GB")
    for project in ("red", "blue"):
        s.cli("project", "create", project, "--deserved-gpus", "1")
    rita = str(s.json("user", "create", "rita", "--project", "red")["token"])
    bob = str(s.json("user", "create", "bob", "--project", "blue")["token"])
    # The victim: a listener on its loopback, as a notebook's kernel listens.
    s.cli("submit", "-p", "blue", "--name", "kernel", "--", "python3", "-c", LISTEN.format(port=47001), token=bob)
    _lines(s, "kernel", bob, "LISTENING", 1)
    api = int(s.url.rsplit(":", 1)[1])
    argv = ["python3", "-c", PROBE, "47001", f"127.0.0.1:{api}", f"127.0.0.1:{loopback_only}",
            f"{_host_address()}:{everywhere}"]  # fmt: skip
    s.cli("submit", "-p", "red", "--name", "probe", "--", *argv, token=rita)
    got = _lines(s, "probe", rita, "REACH", 4) + _lines(s, "probe", rita, "PROCNET", 1)
    assert got == [
        "REACH 127.0.0.1 47001 ConnectionRefusedError",  # blue's listener is in blue's network
        f"REACH 127.0.0.1 {api} open",  # the API's port, forwarded (GPUPOOL_URL)
        f"REACH 127.0.0.1 {loopback_only} ConnectionRefusedError",  # the host's loopback is not mapped
        f"REACH {_host_address()} {everywhere} open",  # the way out (NAT) reaches what the network may
        "PROCNET unseen",
    ]
    # describe says what holds.
    detail = s.json("describe", "probe", token=rita)
    assert detail["isolation"]["network"].startswith("enforced: a namespace per workload")


@SQLITE
def test_a_gangs_members_share_their_loopback_and_only_an_admin_grants_the_hosts_network(
    make_server: Callable[..., Server], host_services: tuple[int, int]
) -> None:
    loopback_only, _ = host_services
    s = make_server("fake:2xH100-80GB")
    s.cli("project", "create", "red", "--deserved-gpus", "2")
    rita = str(s.json("user", "create", "rita", "--project", "red")["token"])
    # Member 0 listens on the gang's master port; member 1 reaches it at 127.0.0.1 (what torchrun does).
    gang = (
        "import os, socket, time\n"
        "port = int(os.environ['MASTER_PORT'])\n"
        "if os.environ['RANK'] == '0':\n"
        "    s = socket.socket(); s.bind(('127.0.0.1', port)); s.listen()\n"
        "    c, _ = s.accept(); print('MET', flush=True)\n"
        "else:\n"
        "    for _ in range(300):\n"
        "        try:\n"
        "            socket.create_connection(('127.0.0.1', port), timeout=1).close(); break\n"
        "        except OSError:\n"
        "            time.sleep(0.1)\n"
        "    print('MET', flush=True)\n"
    )
    s.cli("submit", "-p", "red", "--name", "pair", "--workers", "2", "--gpus", "1", "--", "python3", "-c", gang)
    assert s.wait_state("pair", "succeeded", timeout=90)["state"] == "succeeded"
    # The grant is an admin's: a member is refused, the server's admin sets it, and describe says so.
    denied = s.cli("project", "set", "red", "--host-network", token=rita, check=False)
    assert (denied.returncode, denied.stderr.strip()) == (
        1,
        "error: your role (member) cannot change the settings of 'red'",
    )
    assert "the host's network" in s.cli("project", "set", "red", "--host-network").stdout
    argv = ["python3", "-c", PROBE, str(loopback_only)]
    s.cli("submit", "-p", "red", "--name", "hosted", "--", *argv, token=rita)
    assert _lines(s, "hosted", rita, "REACH", 1) == [f"REACH 127.0.0.1 {loopback_only} open"]
    detail = s.json("describe", "hosted", token=rita)
    assert detail["isolation"]["network"] == "the host's: an admin granted red the host network"


@SQLITE
def test_a_restarted_server_starts_the_way_out_again_for_the_members_it_adopts(
    make_server: Callable[..., Server],
) -> None:
    s = make_server("fake:1xH100-80GB")
    s.cli("project", "create", "red", "--deserved-gpus", "1")
    api = int(s.url.rsplit(":", 1)[1])
    wait = f"while [ ! -e go ]; do sleep 0.1; done; exec python3 -c \"$0\" 1 127.0.0.1:{api}"
    s.cli("submit", "-p", "red", "--name", "long", "--", "sh", "-c", wait, PROBE)
    row = s.wait_state("long", "running", timeout=60)
    # A service manager's restart ends the server's whole cgroup: its NAT processes with it; the member runs on.
    s.kill()
    for pidfile in (s.data_dir / "netns").glob("*.pasta"):
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
    s.start()
    (s.data_dir / "workloads" / str(row["id"]) / "go").touch()
    assert _lines(s, "long", s.admin_token, "REACH", 2)[1] == f"REACH 127.0.0.1 {api} open"
