"""Tenants that cannot reach each other, on the local backend: a workload of one project tries every way into
another project's workloads and into the server, and every one fails, while it keeps its own GPU, workdir and
environment."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.e2e.conftest import GPUPOOL, Server, free_port, wait_for

ATTACK = r"""
import json, os, signal, socket, sys
data, victim_dir, victim_pid, server_pid, app_sock, service_port = sys.argv[1:7]
out = {}

def attempt(name, fn):
    try:
        fn()
        out[name] = "succeeded"
    except OSError as e:
        out[name] = type(e).__name__

def read(path):
    with open(path, "rb") as f:
        f.read(1)

def connect_unix(path):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(2)
    s.connect(path)

def connect_tcp(port):
    socket.create_connection(("127.0.0.1", int(port)), timeout=2).close()

def write_into(path):
    with open(os.path.join(path, "planted.txt"), "w") as f:
        f.write("x")

attempt("admin_token", lambda: read(os.path.join(data, "admin-token")))
attempt("session_secret", lambda: read(os.path.join(data, "session-secret")))
attempt("store", lambda: read(os.path.join(data, "gpupool.db")))
attempt("victim_workdir_list", lambda: os.listdir(victim_dir))
attempt("victim_workdir_read", lambda: read(os.path.join(victim_dir, "secret.txt")))
attempt("victim_workdir_write", lambda: write_into(victim_dir))
attempt("victim_environ", lambda: read(f"/proc/{victim_pid}/environ"))
attempt("victim_signal", lambda: os.kill(int(victim_pid), signal.SIGTERM))
attempt("server_signal", lambda: os.kill(int(server_pid), signal.SIGTERM))
attempt("server_environ", lambda: read(f"/proc/{server_pid}/environ"))
attempt("victim_app_socket", lambda: connect_unix(app_sock))
attempt("victim_service_port", lambda: connect_tcp(service_port))
out["data_dir_view"] = sorted(os.listdir(data))
out["root_home_view"] = sorted(os.listdir("/root"))
# What it is owed: its own workdir, its environment, its GPU.
attempt("own_workdir_write", lambda: write_into(os.getcwd()))
out["own_secret"] = os.environ.get("MY_SECRET")
out["project_secrets"] = sorted(k for k in os.environ if k.endswith("_KEY"))
out["red_key"] = os.environ.get("RED_KEY")
out["gpus"] = os.environ.get("CUDA_VISIBLE_DEVICES")
out["uid"] = os.getuid()
print("RESULT " + json.dumps(out), flush=True)
"""


def _pid_of(s: Server, alloc: str) -> int:
    return int(json.loads((s.data_dir / "run" / f"{alloc}.json").read_text())["pid"])


def _descendant_of(root: int, uid_not: int) -> int:
    """A process under `root` that runs as another uid than `uid_not`: the sandboxed program itself."""
    procs: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    procs[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    stack, found = [root], []
    while stack:
        pid = stack.pop()
        kids = [p for p, parent in procs.items() if parent == pid]
        stack.extend(kids)
        found.extend(k for k in kids if os.stat(f"/proc/{k}").st_uid != uid_not)
    assert found, f"no sandboxed process under {root}"
    return min(found)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_workload_cannot_reach_another_projects_workloads_or_the_server(
    make_server: Callable[..., Server],
) -> None:
    s = make_server("fake:2xH100-80GB")
    s.cli("project", "create", "red", "--deserved-gpus", "1")
    s.cli("project", "create", "blue", "--deserved-gpus", "1")
    red = s.json("user", "create", "rita", "--project", "red")["token"]
    blue = s.json("user", "create", "bob", "--project", "blue")["token"]
    s.cli("project", "set", "blue", "--production-allowed")  # its member runs a service at production priority
    s.cli("secret", "set", "RED_KEY", "-p", "red", "--value", "red-secret", token=red)
    s.cli("secret", "set", "BLUE_KEY", "-p", "blue", "--value", "blue-secret", token=blue)

    # The victim: a service with a secret in its environment and a file in its workdir.
    serve = ["sh", "-c", 'echo classified > secret.txt; exec python3 -m http.server "$PORT" --bind 0.0.0.0']
    s.cli("submit", "-p", "blue", "--type", "inference", "--name", "svc", "--port", "8123", "--env",
          "TOKEN=blue-secret", "--", *serve, token=blue)  # fmt: skip
    victim = s.wait_state("svc", "running", timeout=60)
    victim_alloc = f"{victim['id']}-0-0"
    victim_dir = s.data_dir / "workloads" / str(victim["id"])
    wait_for(lambda: (victim_dir / "secret.txt").exists(), 10, "the victim's file")
    victim_pid = _descendant_of(_pid_of(s, victim_alloc), os.geteuid())
    app_sock = next(Path("/run/gpupool").glob(f"*/{victim_alloc}/app.sock"))
    assert s.proc is not None

    args = [str(s.data_dir), str(victim_dir), str(victim_pid), str(s.proc.pid), str(app_sock), "8123"]
    s.cli("submit", "-p", "red", "--name", "attacker", "--gpus", "1", "--env", "MY_SECRET=red-own",
          "--", sys.executable, "-c", ATTACK, *args, token=red)  # fmt: skip
    attacker = s.wait_state("attacker", "succeeded", timeout=60)
    log = s.cli("logs", "attacker", token=red).stdout
    line = next((x for x in log.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, log
    got = json.loads(line.removeprefix("RESULT "))

    assert got == {
        "admin_token": "FileNotFoundError",  # the data dir is an empty tmpfs in its view
        "session_secret": "FileNotFoundError",
        "store": "FileNotFoundError",
        "data_dir_view": ["workloads"],  # nothing but the path to its own workdir
        "victim_workdir_list": "FileNotFoundError",
        "victim_workdir_read": "FileNotFoundError",
        "victim_workdir_write": "FileNotFoundError",
        "victim_environ": "FileNotFoundError",  # another PID namespace: no such process
        "victim_signal": "ProcessLookupError",
        "server_signal": "ProcessLookupError",
        "server_environ": "FileNotFoundError",
        "victim_app_socket": "FileNotFoundError",  # /run is its own
        "victim_service_port": "ConnectionRefusedError",  # the service listens in a network of its own
        # the server's home is empty in its view, but for the way to the Python notebooks run (pyenv's, say)
        "root_home_view": sorted({Path(p).parts[2] for p in (sys.prefix, sys.base_prefix) if p.startswith("/root/")}),
        "own_workdir_write": "succeeded",
        "own_secret": "red-own",
        "project_secrets": ["RED_KEY"],  # its project's secret, and not the other's
        "red_key": "red-secret",
        "gpus": "0",
        "uid": (s.data_dir / "workloads" / str(attacker["id"])).stat().st_uid,
    }
    assert s.uid_base < got["uid"] < s.uid_base + 100 and got["uid"] != victim_dir.stat().st_uid
    # Secrets are never shown back, not even to their project.
    listed = s.json("secret", "list", "-p", "red", token=red)
    assert [(x["name"], sorted(x)) for x in listed] == [("RED_KEY", ["name", "project", "updated_at", "updated_by"])]
    assert "red-secret" not in json.dumps(s.json("describe", "attacker", token=red))
    assert (victim_dir / "secret.txt").read_text() == "classified\n"
    assert not (victim_dir / "planted.txt").exists()

    # Through the server's proxy: the victim's own member gets in; the attacker's member does not learn it exists.
    url = f"{s.url}/apps/blue/svc/"
    assert httpx.get(url, headers={"Authorization": f"Bearer {blue}"}, timeout=10).status_code == 200
    assert httpx.get(url, headers={"Authorization": f"Bearer {red}"}, timeout=10).status_code == 404
    assert httpx.get(url, timeout=10).status_code == 401
    assert s.proc.poll() is None and signal.SIGTERM


@pytest.fixture
def nobody_home() -> Iterator[Path]:
    """A home for an unprivileged user; not under pytest's temp root, which is private to root."""
    home = Path(tempfile.mkdtemp(prefix="gpupool-nobody-"))
    os.chown(home, 65534, 65534)
    yield home
    shutil.rmtree(home, ignore_errors=True)


def _as_nobody(data: Path, *args: str) -> subprocess.Popen[str]:
    env = {"PATH": os.environ["PATH"], "HOME": str(data), "XDG_CONFIG_HOME": str(data / "config")}
    cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", GPUPOOL, "server", "--data-dir",
           str(data / "data"), "--port", str(free_port()), "--gpus", "fake:1xH100-80GB", *args]  # fmt: skip
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_server_that_cannot_give_workloads_identities_refuses_to_start(nobody_home: Path) -> None:
    proc = _as_nobody(nobody_home)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "this one runs as uid 65534" in out and "--single-user" in out
    assert "Traceback" not in out


def test_single_user_mode_says_at_every_start_that_tenants_are_not_isolated(nobody_home: Path) -> None:
    proc = _as_nobody(nobody_home, "--single-user")
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
        assert "--single-user: workloads run as this server's user; tenants are NOT isolated\n" in [
            line.removeprefix("gpupool: ") for line in lines
        ]
    finally:
        proc.kill()
        proc.wait(10)


ECHO = """
import os
from websockets.sync.server import serve

def echo(ws):
    for message in ws:
        ws.send(message)

with serve(echo, "127.0.0.1", int(os.environ["PORT"])) as server:
    server.serve_forever()
"""


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_member_removed_from_the_project_loses_an_open_app_connection(make_server: Callable[..., Server]) -> None:
    s = make_server("fake:1xH100-80GB", "--app-recheck", "1")
    s.cli("project", "create", "lab", "--deserved-gpus", "1")
    s.cli("project", "set", "lab", "--production-allowed")
    bob = s.json("user", "create", "bob", "--project", "lab")["token"]
    # The service brings its own dependency, as a user's would: an environment of the project's own is built.
    (s.cwd / "requirements.txt").write_text("websockets\n")
    s.cli("submit", "-p", "lab", "--type", "inference", "--name", "echo", "--port", "8000", "--",
          "python", "-c", ECHO, token=bob)  # fmt: skip
    s.wait_state("echo", "running", timeout=180)
    url = f"{s.url.replace('http://', 'ws://')}/apps/lab/echo/"
    with connect(url, additional_headers={"Authorization": f"Bearer {bob}"}, open_timeout=10) as ws:
        ws.send("hello")
        assert ws.recv(timeout=10) == "hello"
        s.cli("member", "remove", "lab", "bob")

        def closed() -> bool:
            try:
                ws.recv(timeout=0.2)
            except TimeoutError:
                return False
            except ConnectionClosed:
                return True
            return False

        wait_for(closed, 10, "the proxy to close the removed member's connection")
    with pytest.raises(InvalidStatus) as refused:
        connect(url, additional_headers={"Authorization": f"Bearer {bob}"}, open_timeout=10)
    assert refused.value.response.status_code == 403  # refused before the handshake is accepted
