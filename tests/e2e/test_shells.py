"""Shells into running workloads on the local backend (sandboxed, the server as root): exec with and without a
TTY, attach, port-forward, who may open them, and the audit trail of each session; the same into a member that
runs in an image (podman), with a busybox image built here."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import shlex
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from gpupool.backends.local import envs
from tests.backends.test_environments import build_image
from tests.e2e.conftest import GPUPOOL, Server, wait_for

IMAGE = "localhost/gpupool-e2e-shells-busybox:1"
ECHO = "import sys\nfor line in sys.stdin:\n    print('echo:' + line.strip(), flush=True)\n"


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_image(tmp_path_factory.mktemp("image"), IMAGE)


def _remove_containers(s: Server) -> None:
    """The server's containers (podman's monitors outlive the wrappers the server's teardown kills)."""
    s.stop_workloads()


def _tenants(s: Server) -> tuple[str, str]:
    s.cli("project", "create", "red", "--deserved-gpus", "1")
    s.cli("project", "create", "blue", "--deserved-gpus", "1")
    red = s.json("user", "create", "rita", "--project", "red")["token"]
    blue = s.json("user", "create", "bob", "--project", "blue")["token"]
    return red, blue


def _env(s: Server, token: str) -> dict[str, str]:
    return s.env | {"GPUPOOL_URL": s.url, "GPUPOOL_TOKEN": token}


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _running(cmdline: bytes) -> bool:
    return any(_cmdline(pid) == cmdline for pid in os.listdir("/proc") if pid.isdigit())


def _under_pty(s: Server, token: str, *args: str) -> tuple[int, str]:
    """The CLI run with a pseudo-terminal as its stdin, stdout and stderr, as in a user's terminal."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))  # a 100x40 terminal
        os.chdir(s.cwd)
        os.execve(GPUPOOL, [GPUPOOL, *args], _env(s, token))
    out = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1)
        if not ready:
            continue
        try:
            data = os.read(fd, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        out += data
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_exec_runs_inside_the_members_sandbox_for_its_project_only(make_server: Callable[..., Server]) -> None:
    s = make_server("fake:2xH100-80GB")
    red, blue = _tenants(s)
    vic = s.json("user", "create", "vic")["token"]
    s.cli("member", "set", "red", "vic", "--role", "viewer")
    s.cli("submit", "-p", "blue", "--name", "vault", "--env", "VAULT=1", "--",
          "sh", "-c", "echo classified > secret.txt; exec sleep 601", token=blue)  # fmt: skip
    s.cli("submit", "-p", "red", "--name", "job", "--env", "GREETING=hello", "--",
          "sh", "-c", "echo mine > mine.txt; exec sleep 602", token=red)  # fmt: skip
    vault = s.wait_state("vault", "running", timeout=60)
    job = s.wait_state("job", "running", timeout=60)
    vault_dir = s.data_dir / "workloads" / str(vault["id"])
    job_dir = s.data_dir / "workloads" / str(job["id"])
    wait_for(lambda: (job_dir / "mine.txt").exists() and (vault_dir / "secret.txt").exists(), 20, "the files")

    # Its output, its exit status, its workdir, its environment (not the server's), its identity.
    # (GPUPOOL_URL is the workload's own, with its own token; the CLI's settings stay with the CLI.)
    script = (
        'cat mine.txt; echo "$GREETING" "${XDG_CONFIG_HOME:-no-config}" "$GPUPOOL_URL"; id -u; echo oops >&2; exit 7'
    )
    done = s.cli("exec", "job", "--", "sh", "-c", script, token=red, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (
        7,
        f"mine\nhello no-config {s.url}\n{job_dir.stat().st_uid}\n",
        "oops\n",
    )
    assert job_dir.stat().st_uid != 0

    # Another project's processes and files are out of its sight.
    peek = ("import os; print(sorted(open(f'/proc/{p}/cmdline','rb').read().replace(b'\\0', b' ').decode() "
            "for p in os.listdir('/proc') if p.isdigit()))")  # fmt: skip
    seen = s.cli("exec", "job", "--", "python3", "-c", peek, token=red).stdout
    assert "sleep 602" in seen and "sleep 601" not in seen
    cat = s.cli("exec", "job", "--", "cat", str(vault_dir / "secret.txt"), token=red, check=False)
    assert cat.returncode == 1 and "No such file or directory" in cat.stderr

    # A terminal, when the CLI has one.
    code, out = _under_pty(s, red, "exec", "job", "--", "sh", "-c", "tty; stty size; exit 4")
    assert code == 4 and re.fullmatch(r"/dev/pts/\d+\r\n40 100\r\n", out), out

    # Who may: a viewer is refused; another tenant is told there is no such workload.
    viewer = s.cli("exec", "job", "-p", "red", "--", "true", token=vic, check=False)
    assert (viewer.returncode, viewer.stderr) == (
        1, "error: a project's viewers cannot open shells into its workloads; its members can\n"
    )  # fmt: skip
    other = s.cli("exec", "job", "-p", "red", "--", "true", token=blue, check=False)
    assert (other.returncode, other.stderr) == (1, "error: no project named 'red'\n")
    nothing = s.cli("exec", "vault", "--", "true", token=red, check=False)
    assert (nothing.returncode, nothing.stderr) == (1, "error: no workload named 'vault'\n")

    rank = s.cli("exec", "job", "--rank", "5", "--", "true", token=red, check=False)
    assert (rank.returncode, rank.stderr) == (1, "error: 'job' has no running member of rank 5\n")
    with pytest.raises(InvalidStatus) as refused:
        connect(f"{s.url.replace('http', 'ws')}/api/v1/workloads/job/exec?command=true", open_timeout=10)
    assert refused.value.response.status_code == 401

    trail = [(a.actor, a.object, a.action, a.status) for a in s.client().audit(limit=50) if "rank" in a.action]
    assert ("rita", "workload/job", f"exec rank 0: sh -c {shlex.quote(script)}"[:96], 101) in trail
    assert ("rita", "workload/job", "exec rank 0: sh -c 'tty; stty size; exit 4'", 101) in trail
    assert ("vic", "workload/job", "exec rank 0: true", 403) in trail
    assert ("bob", "workload/job", "exec rank 0: true", 404) in trail


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_attach_talks_to_a_jobs_stdin_and_port_forward_reaches_its_server(make_server: Callable[..., Server]) -> None:
    s = make_server("fake:2xH100-80GB", "--app-recheck", "1")
    red, _ = _tenants(s)
    s.cli("project", "set", "red", "--production-allowed")
    s.cli("submit", "-p", "red", "--name", "echoer", "--", "python3", "-u", "-c", ECHO, token=red)
    (s.cwd / "index.html").write_text("hello from inside\n")
    s.cli("submit", "-p", "red", "--type", "inference", "--name", "web", "--port", "8123", "--",
          "python3", "-m", "http.server", "8123", "--bind", "127.0.0.1", token=red)  # fmt: skip
    s.wait_state("echoer", "running", timeout=60)
    s.wait_state("web", "running", timeout=60)

    attach = subprocess.Popen([GPUPOOL, "attach", "echoer"], env=_env(s, red), cwd=s.cwd, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    forward = subprocess.Popen([GPUPOOL, "port-forward", "web", "0:8123"], env=_env(s, red), cwd=s.cwd,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert attach.stdin is not None and attach.stdout is not None
        attach.stdin.write(b"hello\n")
        attach.stdin.flush()
        assert attach.stdout.readline() == b"echo:hello\n"
        assert "echo:hello\n" in s.cli("logs", "echoer", token=red).stdout

        assert forward.stdout is not None
        line = forward.stdout.readline()
        port = int(re.fullmatch(r"Forwarding from 127\.0\.0\.1:(\d+) -> 8123\n", line)[1])  # type: ignore[index]
        got = httpx.get(f"http://127.0.0.1:{port}/index.html", timeout=30)
        assert (got.status_code, got.text) == (200, "hello from inside\n")

        # Taken out of the project, she loses the session she has open.
        s.cli("member", "remove", "red", "rita", "--keep-work")  # her job runs on: this is about her sessions
        assert attach.wait(30) == 1
        assert attach.stderr is not None
        assert attach.stderr.read() == b"gpupool: you may no longer use this workload's shells\n"
    finally:
        for p in (attach, forward):
            p.kill()
            p.wait(10)
    trail = [(a.actor, a.object, a.action, a.status) for a in s.client().audit(limit=50) if "rank" in a.action]
    assert ("rita", "workload/echoer", "attach rank 0", 101) in trail
    assert ("rita", "workload/web", "port-forward rank 0: port 8123", 101) in trail


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_exec_on_a_single_user_server_runs_in_the_workdir_with_the_workloads_environment(
    make_server: Callable[..., Server], image: str
) -> None:
    s = make_server("fake:1xH100-80GB", "--single-user")
    s.cli("project", "create", "solo", "--deserved-gpus", "1")
    s.cli("submit", "-p", "solo", "--name", "job", "--env", "GREETING=hi", "--", "sleep", "603")
    s.cli("submit", "-p", "solo", "--name", "boxed", "--image", image, "--env", "GREETING=hey", "--", "sleep", "606")
    try:
        for name, greeting in (("job", "hi"), ("boxed", "hey")):
            job = s.wait_state(name, "running", timeout=60)
            done = s.cli("exec", name, "--", "sh", "-c", 'pwd; echo "$GREETING"; id -u; exit 3', check=False)
            workdir = s.data_dir / "workloads" / str(job["id"])
            assert (done.returncode, done.stdout, done.stderr) == (3, f"{workdir}\n{greeting}\n{os.geteuid()}\n", "")
    finally:
        _remove_containers(s)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_exec_attach_and_port_forward_reach_a_member_in_an_image(
    make_server: Callable[..., Server], image: str
) -> None:
    s = make_server("fake:2xH100-80GB")
    try:
        _in_an_image(s, image)
    finally:
        _remove_containers(s)


def _in_an_image(s: Server, image: str) -> None:
    red, _ = _tenants(s)
    (s.cwd / "index.html").write_text("hello from the image\n")
    s.cli("submit", "-p", "red", "--name", "boxed", "--image", image, "--env", "GREETING=hello", "--",
          "sh", "-c", "echo mine > mine.txt; exec busybox httpd -f -p 127.0.0.1:18124 -h .", token=red)  # fmt: skip
    s.cli("submit", "-p", "red", "--name", "echoer", "--image", image, "--",
          "sh", "-c", 'while read -r l; do echo "echo:$l"; done', token=red)  # fmt: skip
    boxed = s.wait_state("boxed", "running", timeout=60)
    s.wait_state("echoer", "running", timeout=60)
    workdir = s.data_dir / "workloads" / str(boxed["id"])
    wait_for(lambda: (workdir / "mine.txt").exists(), 30, "the image's first file")

    # Its files, workdir, environment (the member's, not the server's), identity and confinement; its status.
    script = ('cat mine.txt; pwd; echo "$GREETING" "${XDG_CONFIG_HOME:-no-config}" "$GPUPOOL_URL"; id -u; '
              'grep -E "^(CapEff|NoNewPrivs)" /proc/self/status; touch /oops; echo oops >&2; exit 7')  # fmt: skip
    done = s.cli("exec", "boxed", "--", "sh", "-c", script, token=red, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (
        7,
        f"mine\n{workdir}\nhello no-config {s.url}\n{workdir.stat().st_uid}\n"
        "CapEff:\t0000000000000000\nNoNewPrivs:\t1\n",
        "touch: /oops: Read-only file system\noops\n",
    )
    assert workdir.stat().st_uid != 0
    piped = subprocess.run([GPUPOOL, "exec", "boxed", "--", "cat"], input="through\n", env=_env(s, red),
                           cwd=s.cwd, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert (piped.returncode, piped.stdout) == (0, "through\n")

    # A terminal, sized as the CLI's.
    code, out = _under_pty(s, red, "exec", "boxed", "--", "sh", "-c", "busybox tty; busybox stty size; exit 4")
    assert code == 4 and re.fullmatch(r"/dev/pts/\d+\r\n40 100\r\n", out), out

    # The window resized mid-session: podman passes the new size on to the terminal it made.
    script = "busybox stty size; while read -r x; do busybox stty size; done"
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
        os.chdir(s.cwd)
        os.execve(GPUPOOL, [GPUPOOL, "exec", "boxed", "--", "sh", "-c", script], _env(s, red))
    seen = bytearray()

    def shows(size: bytes) -> bool:
        if select.select([fd], [], [], 0.2)[0]:
            seen.extend(os.read(fd, 4096))
        return size in seen

    try:
        wait_for(lambda: shows(b"40 100\r\n"), 30, "the first size")
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 120, 0, 0))  # the kernel tells the CLI: SIGWINCH
        wait_for(lambda: os.write(fd, b"\n") and shows(b"50 120\r\n"), 30, "the new size")
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)

    # A client that goes ends its command, which podman alone would leave running.
    gone = subprocess.Popen([GPUPOOL, "exec", "boxed", "--", "sleep", "605"], env=_env(s, red), cwd=s.cwd,
                            stdin=subprocess.PIPE)  # fmt: skip
    wait_for(lambda: _running(b"sleep\x00605\x00"), 30, "the exec's sleep")
    gone.kill()
    gone.wait(10)
    wait_for(lambda: not _running(b"sleep\x00605\x00"), 30, "the exec's sleep ended with its client")

    attach = subprocess.Popen([GPUPOOL, "attach", "echoer"], env=_env(s, red), cwd=s.cwd, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)  # fmt: skip
    forward = subprocess.Popen([GPUPOOL, "port-forward", "boxed", "0:18124"], env=_env(s, red), cwd=s.cwd,
                               stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert attach.stdin is not None and attach.stdout is not None
        attach.stdin.write(b"hello\n")
        attach.stdin.flush()
        assert attach.stdout.readline() == b"echo:hello\n"
        assert forward.stdout is not None
        line = forward.stdout.readline()
        port = int(re.fullmatch(r"Forwarding from 127\.0\.0\.1:(\d+) -> 18124\n", line)[1])  # type: ignore[index]
        got = httpx.get(f"http://127.0.0.1:{port}/index.html", timeout=30)
        assert (got.status_code, got.text) == (200, "hello from the image\n")
    finally:
        for p in (attach, forward):
            p.kill()
            p.wait(10)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_exec_reaches_a_notebook_in_its_environment_and_a_service_in_its_private_network(
    make_server: Callable[..., Server],
) -> None:
    s = make_server("fake:2xH100-80GB")
    red, _ = _tenants(s)
    s.cli("project", "set", "red", "--production-allowed")
    s.cli("submit", "-p", "red", "--type", "notebook", "--name", "nb", "--gpu", "0.25", "--no-code", token=red)
    s.cli("submit", "-p", "red", "--type", "inference", "--name", "web", "--port", "8125", "--no-code", "--",
          "python3", "-m", "http.server", "8125", "--bind", "127.0.0.1", token=red)  # fmt: skip
    # A job whose environment takes forever to build: a local requirement whose build backend sleeps.
    code = s.cwd / "slow-code"
    (code / "slow").mkdir(parents=True)
    (code / "requirements.txt").write_text("./slow\n")
    (code / "slow" / "pyproject.toml").write_text(
        '[project]\nname = "slow"\nversion = "1"\n'
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
    )
    (code / "slow" / "backend.py").write_text(
        "import time\ndef get_requires_for_build_wheel(config_settings=None):\n    return []\n"
        "def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):\n    time.sleep(600)\n"
    )
    s.cli("submit", "-p", "red", "--name", "slow", "--workdir", str(code), "--", "true", token=red)
    s.wait_state("nb", "running", timeout=90)
    s.wait_state("web", "running", timeout=60)
    s.wait_state("slow", "running", timeout=60)
    building = "error: slow (rank 0) is still building its Python environment; try again once it has started\n"
    wait_for(lambda: s.cli("exec", "slow", "--", "true", token=red, check=False).stderr == building, 60,
             "exec refused while the environment builds")  # fmt: skip
    s.cli("cancel", "slow", token=red)
    base = s.cli("open", "nb", token=red).stdout.strip()
    up = lambda: httpx.get(base + "api/status", headers={"Authorization": f"Bearer {red}"}, timeout=10)  # noqa: E731
    wait_for(lambda: up().status_code == 200, 120, "JupyterLab")

    # The notebook's own environment (which has JupyterLab), never the server's.
    which = "command -v python; python -c 'import sys, jupyterlab; print(sys.prefix)'"
    nb = s.cli("exec", "nb", "--", "sh", "-c", which, token=red)
    assert (nb.stdout, nb.stderr) == (f"{envs.INSIDE}/bin/python\n{envs.INSIDE}\n", "")

    # The service's private network: its port answers inside and not on the host, and the exec is in the service's
    # network namespace (the one its server, as the project's uid, listens in).
    ask = "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8125/').status)"
    wait_for(lambda: s.cli("exec", "web", "--", "python3", "-c", ask, token=red, check=False).stdout == "200\n", 30,
             "the service, from inside")  # fmt: skip
    with pytest.raises(httpx.ConnectError):
        httpx.get("http://127.0.0.1:8125/", timeout=10)
    inside = s.cli("exec", "web", "--", "readlink", "/proc/self/ns/net", token=red).stdout.strip()
    argv = b"python3\x00-m\x00http.server\x008125\x00--bind\x00127.0.0.1\x00"
    served = {os.readlink(f"/proc/{p}/ns/net") for p in os.listdir("/proc")
              if p.isdigit() and _cmdline(p) == argv and os.stat(f"/proc/{p}").st_uid != 0}  # fmt: skip
    assert served == {inside} and inside != os.readlink("/proc/self/ns/net")
