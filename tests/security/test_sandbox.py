"""A tenant is root-equivalent inside its namespaces and root is the prize: the attacks of the security round
against a real root server with sandboxing on (the default), each of which got root on the host before the fix,
and the class tests behind them (docs/security.md, "What a member cannot do")."""

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

import pytest

from gpupool.backends.local import enter, envfd, envs, images, seccomp
from tests.e2e.conftest import Server, wait_for

SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)

KERNEL_SURFACE = r"""
import ctypes, errno, json, os, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
out = {}
def call(name, *args):
    r = getattr(libc, name)(*args)
    out[name] = "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]
call("unshare", 0x10000000)            # CLONE_NEWUSER
call("unshare", 0x00020000)            # CLONE_NEWNS
out["unshare -Urm"] = subprocess.run(["unshare", "-Urm", "true"], capture_output=True).returncode
call("mount", b"none", b"/tmp", b"tmpfs", 0, None)
h = ctypes.create_string_buffer(128); ctypes.memmove(h, (120).to_bytes(4, "little"), 4)
mid = ctypes.c_int()
libc.name_to_handle_at(-100, b"/", h, ctypes.byref(mid), 0)
call("open_by_handle_at", -100, h, 0)
call("syscall", 250, 0, 0)             # keyctl (x86_64)
call("syscall", 321, 0, 0, 0)          # bpf (x86_64)
t = threading.Thread(target=lambda: None); t.start(); t.join()
out["thread"] = "ok"
out["subprocess"] = subprocess.run(["true"]).returncode
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
out["status"] = {k: status[k].strip() for k in ("Uid", "NoNewPrivs", "CapEff", "CapPrm", "CapBnd", "Seccomp")}
print("RESULT " + json.dumps(out, sort_keys=True), flush=True)
"""


PRINT_ENV = (
    "import os; [print(f'{k}={v}', flush=True) for k, v in sorted(os.environ.items())]; "
    "os.execvp('sleep', ['sleep', '600'])"
)


def _tenant(s: Server) -> str:
    s.cli("project", "create", "red", "--deserved-gpus", "1")
    return str(s.json("user", "create", "rita", "--project", "red")["token"])


def _result(s: Server, name: str) -> dict[str, object]:
    def found() -> dict[str, object] | None:
        for line in s.cli("logs", name).stdout.splitlines():
            if line.startswith("RESULT "):
                return dict(json.loads(line[7:]))
        return None

    return dict(wait_for(found, 60, f"{name}'s result"))


@SQLITE
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the syscall numbers in the probe are x86_64's")
def test_a_member_cannot_make_namespaces_mount_or_reach_the_kernels_surface(make_server: Callable[..., Server]) -> None:
    s = make_server("fake:2xH100-80GB")
    red = _tenant(s)
    (s.cwd / "probe.py").write_text(KERNEL_SURFACE)
    s.cli("submit", "-p", "red", "--name", "probe", "--", "python3", "probe.py", token=red)
    got = _result(s, "probe")
    uid = str(s.json("describe", "probe", token=red)["id"])  # (only to tie the failure message to the workload)
    status = got.pop("status")
    assert got == {
        "unshare": "EPERM", "unshare -Urm": 1, "mount": "EPERM", "open_by_handle_at": "EPERM", "syscall": "EPERM",
        "thread": "ok", "subprocess": 0,
    }, uid  # fmt: skip
    assert isinstance(status, dict)
    assert status["Uid"].split()[0] != "0"
    assert (status["NoNewPrivs"], status["CapEff"], status["CapPrm"], status["CapBnd"], status["Seccomp"]) == (
        "1", "0000000000000000", "0000000000000000", "0000000000000000", "2"
    )  # fmt: skip


@SQLITE
def test_exec_runs_as_the_project_with_no_capabilities_and_the_members_filter(
    make_server: Callable[..., Server],
) -> None:
    s = make_server("fake:2xH100-80GB")
    red = _tenant(s)
    s.cli("submit", "-p", "red", "--name", "job", "--", "sleep", "600", token=red)
    job = s.wait_state("job", "running", timeout=60)
    owner = (s.data_dir / "workloads" / str(job["id"])).stat().st_uid
    script = "grep -E '^(Uid|CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status | tr -s '\\t ' ' '; unshare -U true"

    def run() -> subprocess.CompletedProcess[str] | None:
        done = s.cli("exec", "job", "--", "sh", "-c", script, token=red, check=False)
        return None if "has not started" in done.stderr else done

    done = wait_for(run, 30, "the exec")
    assert done.stdout == (
        f"Uid: {owner} {owner} {owner} {owner}\nCapEff: 0000000000000000\nCapBnd: 0000000000000000\n"
        "NoNewPrivs: 1\nSeccomp: 2\n"
    )
    assert done.returncode == 1 and "Operation not permitted" in done.stderr


@SQLITE
def test_no_tool_the_server_runs_as_root_for_a_member_sees_the_members_variables(
    make_server: Callable[..., Server],
) -> None:
    """The class of CONTAINERS_CONF, GCONV_PATH, LOCPATH and IFS: the member gets its variables, and every process
    of its launch that runs as root (the wrapper, bubblewrap, its reaper) has the server's fixed environment."""
    s = make_server("fake:2xH100-80GB")
    red = _tenant(s)
    planted = {"CONTAINERS_CONF": "/tmp/evil.conf", "GCONV_PATH": "/tmp/gconv", "LOCPATH": "/tmp/loc", "IFS": "/"}
    words = [x for k, v in planted.items() for x in ("--env", f"{k}={v}")]
    s.cli("submit", "-p", "red", "--name", "job", *words, "--", "python3", "-c", PRINT_ENV, token=red)
    s.wait_state("job", "running", timeout=60)
    seen = wait_for(lambda: "LOCPATH=" in (out := s.cli("logs", "job", token=red).stdout) and out, 30, "its env")
    assert all(f"{k}={v}\n" in seen for k, v in planted.items())
    records = wait_for(lambda: sorted((s.data_dir / "run").glob("*.json")), 20, "its launch record")
    wrapper = int(json.loads(records[0].read_text())["pid"])
    roots = [p for p in _tree(wrapper) if os.stat(f"/proc/{p}").st_uid == 0]
    assert len(roots) >= 3  # the wrapper, bubblewrap, its reaper
    for pid in roots:
        # (PWD: the shells' own, the workdir's path, set by /bin/sh from where it starts)
        assert {k: v for k, v in _environ(pid).items() if k != "PWD"} == envfd.ROOT_ENV, (pid, _cmd(pid))


@SQLITE
def test_an_image_is_named_plainly_never_a_file_or_a_transport(make_server: Callable[..., Server]) -> None:
    s = make_server("fake:2xH100-80GB")
    red = _tenant(s)
    for image in ("oci-archive:/tmp/evil.tar", "docker-archive:evil.tar", "dir:/tmp/evil", "docker://evil/x",
                  "containers-storage:localhost/x", "OCI-ARCHIVE:/x", "Evil/Name", "x//y"):  # fmt: skip
        done = s.cli("submit", "-p", "red", "--image", image, "--", "true", token=red, check=False)
        assert done.returncode == 2 and f"image {image!r} " in done.stderr, (image, done.stderr)
    assert s.json("list", "--all-runs", token=red) == []


def test_podman_runs_with_its_fixed_environment_and_the_member_gets_its_own_in_a_file(tmp_path: Path) -> None:
    member = {"CONTAINERS_CONF": "/tmp/evil.conf", "A": "1", "PATH": "/evil", "B": "two words"}
    fd = envs.seal_env(member)
    script = 'env | sort; echo ---; cat "$2"'
    words = ["/bin/sh", "-c", script, "podman"]
    done = subprocess.run(
        [sys.executable, "-I", images.__file__, str(fd), str(len(words)), *words, "image", "cmd"],
        capture_output=True, text=True, pass_fds=(fd,), env={"CONTAINERS_CONF": "/tmp/evil.conf"}, check=False,
    )  # fmt: skip
    os.close(fd)
    env, _, file = done.stdout.partition("---\n")
    assert {k: v for k, v in (line.split("=", 1) for line in env.splitlines()) if k not in ("PWD", "SHLVL", "_")} == (
        images.PODMAN_ENV
    )
    assert file == "A=1\nB=two words\nCONTAINERS_CONF=/tmp/evil.conf\n"


@pytest.fixture
def a_view_with_its_own_tools() -> Iterator[tuple[int, Path]]:
    """A process in a mount namespace where /usr/local/sbin and /usr/local/bin hold the tenant's setpriv, nsenter,
    python3, sh and env: each writes its uid to a marker (as the exploit's setpriv gave a root shell)."""
    shared = Path(tempfile.mkdtemp(prefix="gpupool-view-", dir="/tmp"))
    shared.chmod(0o777)  # the tenant's tools, run as the tenant, write here too
    marker = shared / "ran-as"
    fake = f'#!/bin/sh\nid -u >> {marker}\nexec /bin/sh "$@"\n'
    setup = (
        "for d in /usr/local/sbin /usr/local/bin; do mount -t tmpfs none $d || exit 9; "
        "for t in setpriv nsenter python3 sh env; do printf '%s' \"$FAKE\" > $d/$t; chmod 755 $d/$t; done; done; "
        "echo ready; exec sleep 600"
    )
    proc = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "/bin/sh", "-c", setup],
        stdout=subprocess.PIPE, text=True, env={"FAKE": fake, "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    yield proc.pid, marker
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    shutil.rmtree(shared)


POLICY = Path(tempfile.gettempdir()) / "gpupool-test-policy.bpf"


def _enter(target: str, spec: dict[str, object]) -> subprocess.CompletedProcess[str]:
    """enter.py as the server runs it, into `target` (PID:START) as uid 4321."""
    fd = os.memfd_create("spec", 0)
    try:
        os.write(fd, json.dumps(spec).encode())
        return subprocess.run(
            [sys.executable, "-I", "-S", enter.__file__, target, "4321", str(fd), str(POLICY)],
            capture_output=True, text=True, pass_fds=(fd,), env=envfd.ROOT_ENV, check=False,
        )  # fmt: skip
    finally:
        os.close(fd)


def test_entering_a_view_resolves_nothing_of_it_until_the_identity_is_the_members(
    a_view_with_its_own_tools: tuple[int, Path],
) -> None:
    pid, marker = a_view_with_its_own_tools
    seccomp.write(POLICY)
    spec = {"cwd": "/", "argv": ["/usr/bin/id", "-u"], "env": {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/bin"}}
    done = _enter(f"{pid}:{enter.start_time(pid)}", spec)
    assert (done.returncode, done.stdout, done.stderr) == (0, "4321\n", "")
    assert not marker.exists()
    # The tenant's own tools still run, as the tenant, when it names them.
    _enter(f"{pid}:{enter.start_time(pid)}", spec | {"argv": ["setpriv", "-d"]})
    assert marker.read_text() == "4321\n"
    # The pid of a process that ended names another by now: the start time the server found tells them apart.
    marker.unlink()
    stale = _enter(f"{pid}:{enter.start_time(pid) - 1}", spec | {"argv": ["setpriv", "-d"]})
    ended = "gpupool exec: cannot enter the member (the member's sandbox has ended)\n"
    assert (stale.returncode, stale.stdout, stale.stderr) == (126, "", ended)
    assert not marker.exists()


def test_the_policy_refuses_namespaces_for_root_too_and_runs_an_ordinary_program(tmp_path: Path) -> None:
    policy = seccomp.write(tmp_path / "policy.bpf")
    box = ["bwrap", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--unshare-pid", "--seccomp", "9"]
    for command, code in ((["true"], 0), (["unshare", "-U", "true"], 1), (["unshare", "-m", "true"], 1)):
        done = subprocess.run(["/bin/sh", "-c", 'exec "$@" 9<"$0"', str(policy), *box, "--", *command],
                              capture_output=True, env=envfd.ROOT_ENV, check=False)  # fmt: skip
        assert done.returncode == code, (command, done.stderr)


def test_a_requirements_file_that_is_a_link_or_a_fifo_is_refused_without_being_opened(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "requirements.txt").symlink_to("/proc/kmsg")
    with pytest.raises(envs.SourceError, match="symbolic link"):
        envs.plan(tmp_path / "envs", work, False)
    (work / "requirements.txt").unlink()
    os.mkfifo(work / "requirements.txt")
    with pytest.raises(envs.SourceError, match="not a plain file"):
        envs.plan(tmp_path / "envs", work, False)


def test_the_ready_mark_is_never_made_through_a_link_the_projects_build_left(tmp_path: Path) -> None:
    """A package's setup.py, run in the build, links the mark to a file of root's choosing (/etc/nologin)."""
    env, target = tmp_path / "env", tmp_path / "etc-nologin"
    env.mkdir()
    (env / envs.READY).symlink_to(target)
    envs.mark_ready(env)
    assert not target.exists()
    assert (env / envs.READY).is_file() and not (env / envs.READY).is_symlink()


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, ()))
    return out


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.decode().split("=", 1) for item in raw.split(b"\0") if b"=" in item)


def _cmd(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


def test_a_build_gets_where_to_fetch_from_never_a_credential() -> None:
    server = {
        "https_proxy": "http://proxy.corp:3128",
        "HTTP_PROXY": "http://ops:hunter2@proxy.corp:3128",  # a password in the proxy's address
        "UV_INDEX_URL": "https://pypi.corp/simple",
        "UV_EXTRA_INDEX_URL": "https://pypi.org/simple https://bot:tok@private.corp/simple",
        "UV_INDEX_PRIVATE_PASSWORD": "s3cret",
        "UV_PUBLISH_TOKEN": "pypi-abc",
        "UV_CACHE_DIR": "/var/cache/uv",
        "AWS_SECRET_ACCESS_KEY": "nope",
        "SSL_CERT_FILE": "/etc/ssl/corp.pem",
        "HTTPS_PROXY": "alice:S3cret@proxy.corp:3128",  # no scheme, as pip and curl take it
        "UV_FIND_LINKS": "https://pypi.example/simple?token=QUERYSECRET",
    }
    passed, withheld = envs.build_environ(server)
    assert passed == {
        "https_proxy": "http://proxy.corp:3128",
        "SSL_CERT_FILE": "/etc/ssl/corp.pem",
        "UV_INDEX_URL": "https://pypi.corp/simple",
    }
    assert withheld == [
        "HTTPS_PROXY", "HTTP_PROXY", "UV_CACHE_DIR", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS", "UV_INDEX_PRIVATE_PASSWORD",
        "UV_PUBLISH_TOKEN",
    ]  # fmt: skip


def test_the_shared_environment_is_the_servers_alone_and_one_a_project_made_is_made_anew(tmp_path: Path) -> None:
    root = tmp_path / "envs"
    envs.configure(root, {})
    shared = envs.plan(root / envs.SHARED, Path("/nonexistent"), False)
    assert (shared.path / envs.READY).exists() and shared.path.stat().st_uid == os.geteuid()
    # As an older server left it where a project's launch built it: the project's, with its code where all run it.
    tenant = 1_900_000_777
    planted = next(shared.path.glob("lib/python*/site-packages")) / "sitecustomize.py"
    planted.write_text("print('the tenant runs in every project')\n")
    for path in (shared.path, planted, shared.path / envs.READY):
        os.chown(path, tenant, tenant)
    envs.ensure_shared(shared)
    assert not planted.exists()
    assert shared.path.stat().st_uid == os.geteuid() and (shared.path / envs.READY).stat().st_uid == os.geteuid()


def test_a_volumes_mount_point_is_made_through_no_link_in_root_owned_directories_and_never_in_the_hosts_trees(
    tmp_path: Path,
) -> None:
    from gpupool.backends.local import mountpoints
    from gpupool.services.volumes import path_refused

    mountpoints.make(str(tmp_path / "data" / "set"))
    assert (tmp_path / "data" / "set").is_dir() and (tmp_path / "data" / "set").stat().st_uid == 0
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(OSError, match="link is a link or a file"):
        mountpoints.make(str(tmp_path / "link" / "x"))
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 1_900_000_777, 1_900_000_777)
    with pytest.raises(OSError, match="x's directory is not root's"):
        mountpoints.make(str(theirs / "x"))
    assert list(target.iterdir()) == [] and list(theirs.iterdir()) == []
    for path in ("/home/alice/.ssh", "/root/.ssh/authorized_keys", "/var/spool/cron", "/opt/app", "/srv/x"):
        assert path_refused(path) == f"/{path.split('/')[1]} belongs to the system or the sandbox", path
    assert path_refused("/data") is None and path_refused("/mnt/datasets") is None


VSOCK_AND_NEWER = r"""
import ctypes, errno, json, socket, threading
libc = ctypes.CDLL(None, use_errno=True)
def call(*args):
    return "ok" if libc.syscall(*args) >= 0 else errno.errorcode[ctypes.get_errno()]
out = {"vsock": call(41, 40, 1, 0), "fanotify_init": call(300, 0, 0), "open_tree_attr": call(467, -100, b"/", 0, 0, 0),
       "newer than the policy": call(471, 0), "inet": call(41, 2, 1, 0),
       "modify_ldt": call(154, 0, 0, 0)}
t = threading.Thread(target=lambda: None); t.start(); t.join()
out["thread"] = "ok"
print(json.dumps(out, sort_keys=True))
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the syscall numbers in the probe are x86_64's")
def test_the_policy_refuses_vsock_fanotify_and_calls_newer_than_itself(tmp_path: Path) -> None:
    policy = seccomp.write(tmp_path / "policy.bpf")
    box = ["bwrap", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--unshare-pid", "--seccomp", "9"]
    probe = [sys.executable, "-I", "-c", VSOCK_AND_NEWER]
    done = subprocess.run(["/bin/sh", "-c", 'exec "$@" 9<"$0"', str(policy), *box, "--", *probe],
                          capture_output=True, text=True, env=envfd.ROOT_ENV, check=False)  # fmt: skip
    assert json.loads(done.stdout) == {
        "fanotify_init": "EPERM", "inet": "ok", "modify_ldt": "EPERM", "newer than the policy": "ENOSYS",
        "open_tree_attr": "EPERM",
        "thread": "ok", "vsock": "EPERM",
    }, done.stderr  # fmt: skip
    rules = seccomp.oci_profile("x86_64")["syscalls"]
    assert {"names": ["socket"], "args": [{"index": 0, "value": 40, "op": "SCMP_CMP_EQ"}], "action": "SCMP_ACT_ERRNO",
            "errnoRet": 1} in rules  # fmt: skip


FORK_BOMB = r"""
import errno, os, sys, time
cgroup = next(l.split(":", 2)[2] for l in open("/proc/self/cgroup").read().splitlines() if l.split(":")[1] == "pids")
here = f"/sys/fs/cgroup/pids{cgroup}"
children = 0
try:
    while children < 1000:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        children += 1
except BlockingIOError as e:
    at_max = open(f"{here}/pids.current").read().strip() == open(f"{here}/pids.max").read().strip()
    print(f"RESULT stopped {errno.errorcode[e.errno]} at its max {at_max} {open(f'{here}/pids.max').read().strip()}",
          flush=True)
os.killpg(0, 9)
"""


@SQLITE
@pytest.mark.skipif(not Path("/sys/fs/cgroup/pids").is_dir(), reason="the probe reads cgroup v1's pids hierarchy")
def test_a_fork_bomb_stops_at_its_members_pids_limit(make_server: Callable[..., Server]) -> None:
    s = make_server("fake:1xH100-80GB", "--pids-limit", "100")
    rita = _tenant(s)
    s.cli("submit", "-p", "red", "--name", "bomb", "--gpus", "1", "--", sys.executable, "-c", FORK_BOMB, token=rita)
    said = wait_for(lambda: next((x for x in s.cli("logs", "bomb").stdout.splitlines() if x.startswith("RESULT ")),
                                 None), 60, "the bomb to stop")  # fmt: skip
    assert said == "RESULT stopped EAGAIN at its max True 100"
    described = s.json("describe", "bomb")
    assert described["isolation"]["processes"] == "enforced: private PID and IPC namespaces; at most 100 per member"
