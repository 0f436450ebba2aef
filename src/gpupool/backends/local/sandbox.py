"""What keeps a local workload away from the server and from other projects' workloads.

Each project gets an OS identity of its own: uid = gid = `uid_base + project id`, from a reserved range with no
/etc/passwd entry on the host (as systemd's DynamicUser does), so nothing accumulates on the host and a deleted
project leaves no account behind. A project, not a user, because a project is the unit that shares quota, files
and work (every member may already cancel and read each other's workloads), as a Kubernetes namespace is.

A member runs under bubblewrap, started by the (root) server and dropping to that identity with setpriv:
- a private mount view: the system read-only, the server's data dir and HOME hidden behind empty tmpfs, its own
  working directory bound writable, a private /tmp, and a passwd file that names its identity;
- a private PID and IPC view: it sees and can signal only its own processes, and no other /proc/<pid>/environ;
- no capabilities and no_new_privs (setuid binaries give nothing back);
- apps (notebooks and inference services) listen where only the server can reach them: a notebook on a Unix
  socket in a directory of its identity's (mode 700), a service in a network namespace of its own whose port is
  bridged to such a socket;
- CPU and memory requests become cgroup limits where the host lets the server create cgroups.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from gpupool.backends.local import envfd, envs, images, mountpoints, netns, seccomp, uidrange
from gpupool.models import imageref

APP_DIR_INSIDE = "/run/gpupool"
APP_SOCKET = "app.sock"
CPU_PERIOD_US = 100_000


class SandboxError(Exception):
    """The host cannot isolate workloads as asked; the message says what is missing and what to do."""


@dataclass(frozen=True, slots=True)
class Limits:
    """How CPU and memory requests are enforced: 'cgroup-v1', 'cgroup-v2', 'systemd' or 'advisory'."""

    mode: str
    root: Path | None = None
    """Where per-member cgroups are made: the server's own cgroup (v2) or a controller's copy of it (v1)."""
    cpu_root: Path | None = None
    pids_root: Path | None = None
    """Where members' pids cgroups are made (v1's pids hierarchy); v2 keeps them with the others."""
    pids: bool = False
    """Whether a member's processes are counted and capped (a pids cgroup, or systemd's TasksMax)."""


@dataclass(frozen=True, slots=True)
class Isolation:
    """What this host enforces; shown by `describe` and the server's start banner."""

    sandboxed: bool
    limits: Limits

    def summary(self, pids_limit: int | None = None) -> dict[str, str]:
        if not self.sandboxed:
            return {
                "identity": "advisory: workloads run as the server's user (--single-user); tenants are not isolated",
                "filesystem": "advisory",
                "processes": "advisory",
                "apps": "advisory: reachable by anyone on this host",
                "network": "advisory: the host's",
                "cpu_memory": "advisory",
            }
        limits = "advisory" if self.limits.mode == "advisory" else f"requests are limits ({self.limits.mode})"
        processes = "enforced: private PID and IPC namespaces"
        if pids_limit is not None:
            processes += f"; at most {pids_limit} per member" if self.limits.pids else "; their number advisory"
        return {
            "identity": "enforced: an unprivileged uid of the project's own",
            "filesystem": "enforced: bubblewrap; system read-only, own workdir and private /tmp writable",
            "processes": processes,
            "apps": "enforced: reachable only through the server's authenticating proxy",
            "network": "enforced: a namespace per workload (its own loopback, NAT out, the API's port in); "
            "the host's for projects an admin grants it",
            "cpu_memory": limits,
        }


def probe(single_user: bool) -> Isolation:
    """What this host can enforce. Raises SandboxError when workloads cannot get identities of their own and
    single-user mode was not asked for."""
    if single_user:
        return Isolation(False, Limits("advisory"))
    if os.geteuid() != 0:
        raise SandboxError(
            "gpupool runs workloads under identities of their own, which needs a server started as root; "
            f"this one runs as uid {os.geteuid()}. Start it as root, or pass --single-user to run every workload "
            "as this user with no isolation between tenants (one person's machine only)"
        )
    for tool, package in (("bwrap", "bubblewrap"), ("setpriv", "util-linux"), ("socat", "socat")):
        if shutil.which(tool) is None:
            raise SandboxError(f"{tool} is not installed: install Debian's {package} (or pass --single-user)")
    lacking = netns.missing()
    if lacking is not None:
        raise SandboxError(f"{lacking}, which gives each workload a network of its own (or pass --single-user)")
    box = ["bwrap", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--unshare-pid", "--unshare-net", "--"]
    trial = subprocess.run([*box, "true"], capture_output=True, text=True, timeout=30)
    if trial.returncode != 0:
        raise SandboxError(
            f"bubblewrap cannot make namespaces on this host ({trial.stderr.strip() or trial.returncode}); "
            "a container needs CAP_SYS_ADMIN for it. Fix that, or pass --single-user"
        )
    try:
        policy = seccomp.program()
    except seccomp.Unsupported as e:
        raise SandboxError(f"{e}: a sandbox here could not refuse the kernel's namespaces (pass --single-user)") from e
    read, write = os.pipe()
    try:
        os.write(write, policy)  # a few hundred bytes: the pipe holds them
        os.close(write)
        test = "unshare -U true 2>/dev/null && exit 1; exit 0"
        filtered = subprocess.run(
            [*box[:-1], "--seccomp", str(read), "--", "/bin/sh", "-c", test],
            capture_output=True, timeout=30, pass_fds=(read,), env=envfd.ROOT_ENV, check=False,
        )  # fmt: skip
    finally:
        os.close(read)
    if filtered.returncode != 0:
        raise SandboxError(
            "bubblewrap's syscall policy does not hold on this host (a sandbox could make a user namespace); "
            "gpupool will not run tenants there. Pass --single-user for one person's machine"
        )
    return Isolation(True, _limits())


def _limits() -> Limits:
    if Path("/run/systemd/system").is_dir() and shutil.which("systemd-run"):
        return Limits("systemd", pids=True)
    own = _own_cgroups()
    unified = Path("/sys/fs/cgroup")
    controllers = unified / "cgroup.controllers"
    if controllers.exists():  # a pure v2 host: children of our cgroup, where its controllers are delegated
        base = unified / own.get("", "/").lstrip("/") / "gpupool"
        with contextlib.suppress(OSError):
            base.mkdir(exist_ok=True)
            (base / "cgroup.subtree_control").write_text("+cpu +memory")
            pids = False
            with contextlib.suppress(OSError):
                (base / "cgroup.subtree_control").write_text("+pids")
                pids = True
            return Limits("cgroup-v2", base, pids=pids)
        return Limits("advisory")
    memory, cpu = unified / "memory", unified / "cpu"
    if memory.is_dir() and cpu.is_dir():
        mem_root = memory / own.get("memory", "/").lstrip("/") / "gpupool"
        cpu_root = cpu / own.get("cpu", own.get("cpu,cpuacct", "/")).lstrip("/") / "gpupool"
        pids_root = unified / "pids" / own.get("pids", "/").lstrip("/") / "gpupool"
        with contextlib.suppress(OSError):
            mem_root.mkdir(exist_ok=True)
            cpu_root.mkdir(exist_ok=True)
            try:
                pids_root.mkdir(exist_ok=True)
                pids = True
            except OSError:  # no pids hierarchy: the number of a member's processes stays advisory
                pids = False
            return Limits("cgroup-v1", mem_root, cpu_root, pids_root if pids else None, pids)
    return Limits("advisory")


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per controller ('' for the unified hierarchy)."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for c in controllers.split(","):
                out[c] = path
            if "," in controllers:
                out[controllers] = path
    return out


@dataclass(frozen=True, slots=True)
class Member:
    """One member to be sandboxed: whose it is, where it works, and what it may use."""

    alloc_id: str
    project_id: int
    project: str
    workdir: Path
    app_dir: Path
    """Outside path of the directory holding its app socket."""
    private_network: bool
    """A network namespace of its own (inference services), with its port bridged to the app socket."""
    port: int | None
    cpu_milli: int
    memory_mib: int
    devices: tuple[str, ...] = ()
    """Device nodes it may open (its GPUs' /dev/nvidiaN and the driver's control nodes)."""
    shared: tuple[str, ...] = ()
    """Directories of the server's it must reach at their own paths (the MPS daemon's pipes and logs)."""
    image: str | None = None
    """An OCI image to run it in (podman); None: this host's system with a Python environment of its own."""
    kind: str = ""
    """The workload's type (a notebook's environment has JupyterLab)."""
    mounts: tuple[tuple[str, str, bool], ...] = ()
    """Project volumes: (host directory, path inside, read-only)."""
    init: tuple[str, ...] = ()
    """Run to its end first, in the build's box (with the network); the member starts only if it succeeds."""
    network: str | None = None
    """Its attempt's network namespace (a file, netns.py), or None: the host's (an admin's grant to its project)."""
    resolv: str | None = None
    """The resolv.conf that names the namespace's DNS forwarder."""


def drop(uid: int) -> list[str]:
    """setpriv's words that drop to a project's identity with no capabilities and no way back."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
            "--inh-caps=-all", "--bounding-set=-all", "--"]  # fmt: skip


def _unsupported_in_image(member: Member) -> str | None:
    """Why the member cannot run in an image here, or None. Apps are reached through a socket the server's proxy
    alone can open; a container has no bridge to it yet."""
    if member.private_network or member.kind in ("notebook", "inference"):
        return (
            "an image is honoured for batch and training work on the local backend; notebooks and services run in "
            "a Python environment of their own (leave out image)"
        )
    return None


class Sandbox:
    def __init__(self, data_dir: Path, isolation: Isolation, uid_base: int, pids_limit: int = 4096) -> None:
        self.data_dir = data_dir
        self.isolation = isolation
        self.uid_base = uid_base
        self.pids_limit = pids_limit
        self._ids = data_dir / "identities"
        self._envs_root = data_dir / "envs"
        self._containers = data_dir / "containers"
        self.policy = data_dir / "seccomp.bpf"
        """The members' syscall policy (seccomp.py), for bubblewrap and for an exec (enter.py)."""
        self.image_policy = data_dir / "seccomp.json"
        """The same policy for podman, for members in an image."""
        if isolation.sandboxed:
            seccomp.write(self.policy)
            seccomp.write_oci(self.image_policy)
        envs.configure(self._envs_root, dict(os.environ))

    def uid(self, project_id: int) -> int:
        if project_id >= uidrange.SPAN:  # past its range: another server's uids (uidrange.py)
            raise SandboxError(f"project id {project_id} is past this server's {uidrange.SPAN} identities")
        return self.uid_base + project_id

    def app_socket(self, app_dir: Path) -> str:
        """Where a notebook listens, as the notebook sees it."""
        if not self.isolation.sandboxed:
            return str(app_dir / APP_SOCKET)
        return f"{APP_DIR_INSIDE}/{APP_SOCKET}"

    def prepare(self, member: Member) -> None:
        """The member's directories, owned by its identity and closed to everyone else."""
        for d in (member.workdir, member.app_dir):
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, 0o700)
            if self.isolation.sandboxed:
                uid = self.uid(member.project_id)
                os.chown(d, uid, uid)

    def home_env(self, member: Member) -> dict[str, str]:
        if not self.isolation.sandboxed:
            return {}
        user = f"gpupool-{member.project}"[:32]
        return {"HOME": str(member.workdir), "USER": user, "LOGNAME": user}

    def argv(self, member: Member, argv: tuple[str, ...], env_fd: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The command that runs `argv` sandboxed, and the cgroup.procs files the launcher joins first: in its
        image through podman, or else in a Python environment of its own, built first where need be (envs.py).
        `env_fd`: the member's environment (envfd.py); every word before the member's own runs without it."""
        reason = self.data_dir / "run" / f"{member.alloc_id}.reason"
        notebook = member.kind == "notebook" or (argv[:1] == (sys.executable,) and argv[1:3] == ("-m", "jupyterlab"))
        root = self._envs_root / str(member.project_id)
        plan: envs.Plan | None = None
        refused = self._mounts_refused(member) or imageref.refused(member.image)
        if refused is None and member.image is None:
            try:
                plan = envs.plan(root, member.workdir, notebook)
            except envs.SourceError as e:
                refused = f"its Python environment cannot be built: {e}"
        if refused is not None:
            return images.cannot_start(refused, reason), ()
        if member.image is not None or plan is None:
            return images.argv(self._container(member, reason), argv, env_fd), ()
        shared = plan.path.parent.name == envs.SHARED
        if shared and self.isolation.sandboxed:
            try:
                envs.ensure_shared(plan)  # the server's, never a project's build
            except (envs.BuildError, OSError) as e:
                return images.cannot_start(f"the shared Python environment cannot be made: {e}", reason), ()
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        seen = envs.INSIDE if self.isolation.sandboxed else str(plan.path)
        # A notebook runs the environment's Python (which has JupyterLab), never the server's.
        command = tuple(f"{seen}/bin/python" if a == sys.executable else a for a in argv[:1]) + argv[1:]
        inner = (*envs.loader_words(env_fd), *command)
        if not self.isolation.sandboxed:
            return (*envs.builder_argv(plan, reason, sys.prefix, None, [], None, env_fd, member.init), *inner), ()
        uid = self.uid(member.project_id)
        cache = str(root / ".uv-cache")
        if not os.path.isdir(cache):  # the build's box binds it, and a member with nothing to install made none
            os.mkdir(cache, 0o700)
            os.chown(cache, uid, uid)
        uv = envs.find_uv()
        tools = ["--ro-bind", uv, uv] if uv is not None else []
        build_box = self._box(
            member, ["--bind", str(plan.path), envs.INSIDE, "--bind", cache, envs.CACHE_INSIDE, *tools], False
        )
        owner = None if shared else uid  # the shared one is found, never built, by a member
        builder = envs.builder_argv(
            plan, reason, sys.prefix, envs.INSIDE, [*build_box, *drop(uid)], owner, env_fd, member.init
        )
        box = self._box(member, ["--ro-bind", str(plan.path), envs.INSIDE], member.private_network)
        if member.private_network and member.port is not None:
            # The service listens on its port inside its own network; only the app socket leads there.
            bridge = (
                f"socat UNIX-LISTEN:{APP_DIR_INSIDE}/{APP_SOCKET},fork,mode=600,unlink-early "
                f'TCP:127.0.0.1:{member.port} & exec "$@"'
            )
            inner = (*envs.loader_words(env_fd), "/bin/sh", "-c", bridge, "gpupool-app", *command)
        # The build is the member's work too: within its scope's limits and cgroups, and in its network.
        enter = ("nsenter", f"--net={member.network}", "--") if member.network is not None else ()
        return (*enter, *self.systemd_prefix(member), *builder, *box, *drop(uid), *inner), self._cgroup(member)

    def _box(self, member: Member, binds: list[str], private_network: bool) -> list[str]:
        """bubblewrap's words for a member's views (see the module's docstring), with `binds` added."""
        passwd, group = self._identity_files(member)
        # bubblewrap reads the syscall policy (seccomp.py) from a descriptor: the shell opens the server's file.
        box = ["/bin/sh", "-c", 'exec "$@" 9<"$0"', str(self.policy), "bwrap", "--seccomp", "9"]
        box += ["--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
        box += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/run"]
        for scratch in ("/tmp", "/var/tmp", "/dev/shm"):  # private, and writable as a /tmp should be
            box += ["--perms", "1777", "--tmpfs", scratch]  # fmt: skip
        for hidden in self._hidden():
            box += ["--tmpfs", hidden]
        box += self._interpreter()
        box += ["--ro-bind", str(passwd), "/etc/passwd", "--ro-bind", str(group), "/etc/group"]
        # Its workdir at its own path, reachable by that path (the parents bwrap would make are closed).
        box += ["--perms", "0755", "--dir", str(member.workdir.parent)]
        box += ["--bind", str(member.workdir), str(member.workdir), "--bind", str(member.app_dir), APP_DIR_INSIDE]
        for dev in member.devices:
            if Path(dev).exists():
                box += ["--dev-bind", dev, dev]
        for shared in member.shared:
            box += ["--bind", shared, shared]
        for source, inside, read_only in member.mounts:
            # The mount point must exist in the view; the system is read-only there, so an empty directory is
            # made on the host where none is (root's, 755: it holds nothing of anyone's), through no link.
            mountpoints.make(inside)
            box += ["--ro-bind" if read_only else "--bind", source, inside]
        box += binds
        if member.resolv is not None:
            box += ["--ro-bind", member.resolv, "/etc/resolv.conf"]
        if private_network and member.network is None:  # a service granted the host's network keeps its port
            box += ["--unshare-net"]
        return [*box, "--chdir", str(member.workdir), "--"]

    def _mounts_refused(self, member: Member) -> str | None:
        """Why the member's volumes cannot be mounted as asked, or None."""
        if not member.mounts:
            return None
        if not self.isolation.sandboxed:
            return ("volumes are mounted into a workload's sandbox, which a --single-user server does not make; "
                    "start the server as root without --single-user to use them")  # fmt: skip
        hidden = (str(self.data_dir), str(member.workdir))
        for _, inside, _ in member.mounts:
            for h in hidden:
                if inside == h or h.startswith(inside.rstrip("/") + "/") or inside.startswith(h + "/"):
                    return f"a volume at {inside} would clash with the workload's working directory ({h})"
            try:
                mountpoints.make(inside, create=False)
            except OSError as e:
                return f"a volume cannot be mounted at {inside}: {e.strerror or e} on this host"
        return None

    def _container(self, member: Member, reason: Path) -> images.Container:
        """What podman needs to run a member as its sandbox would: identity, workdir, devices, limits."""
        uid = self.uid(member.project_id) if self.isolation.sandboxed else os.geteuid()
        gid = uid if self.isolation.sandboxed else os.getegid()
        self._containers.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self._containers / member.alloc_id).touch()  # release() removes what may still run under its name
        return images.Container(
            name=images.name(member.alloc_id, self.data_dir),
            image=str(member.image),
            uid=uid,
            gid=gid,
            workdir=str(member.workdir),
            devices=member.devices,
            cpu_milli=member.cpu_milli if self.isolation.limits.mode != "advisory" else 0,
            memory_mib=member.memory_mib if self.isolation.limits.mode != "advisory" else 0,
            unsupported=_unsupported_in_image(member),
            reason_file=str(reason),
            mounts=member.mounts,
            seccomp=str(self.image_policy) if self.isolation.sandboxed else None,
            pids_limit=self.pids_limit if self.isolation.sandboxed else None,
            network=member.network,
        )

    def runs_python(self, module: str) -> bool:
        """Whether a member can run this server's Python and import `module` (notebooks need JupyterLab): false
        where the interpreter's files are not readable by other users."""
        member = Member("probe", 0, "probe", self.data_dir / "probe" / "work", self.data_dir / "probe" / "app",
                        False, None, 0, 0)  # fmt: skip
        self.prepare(member)
        if not self.isolation.sandboxed:
            return True
        box = self._box(member, [], False)
        argv = (*box, *drop(self.uid(member.project_id)), sys.executable, "-c", f"import {module}")
        done = subprocess.run(argv, capture_output=True, timeout=120, cwd=member.workdir, check=False)
        return done.returncode == 0

    def in_container(self, alloc_id: str) -> bool:
        """Whether the member runs in an image (its container's marker outlives a server restart)."""
        return (self._containers / alloc_id).exists()

    def stop(self, alloc_id: str, grace_s: float) -> None:
        """Ask a member's container to stop: podman sends the image's stop signal (TERM by default) to its first
        process, the one signal a container's PID 1 is sure to see, and kills it after `grace_s`. The container
        is no descendant of the member's wrapper (podman's monitor runs apart), so signals to the wrapper's
        process group never reach it. Returns at once; podman waits out the grace on a thread of its own."""
        threading.Thread(
            target=images.stop,
            args=(images.name(alloc_id, self.data_dir), grace_s),
            name=f"gpupool-stop-{alloc_id}",
            daemon=True,
        ).start()

    def release(self, alloc_id: str) -> None:
        """Remove a member's cgroups, identity files and container (which a member killed hard can leave running:
        podman's monitor is no child of the wrapper) once its processes are gone."""
        marker = self._containers / alloc_id
        if marker.exists():
            images.remove(images.name(alloc_id, self.data_dir))
            with contextlib.suppress(OSError):
                marker.unlink()
        for kind in ("passwd", "group"):
            with contextlib.suppress(OSError):
                (self._ids / f"{alloc_id}.{kind}").unlink()
        for root in (self.isolation.limits.root, self.isolation.limits.cpu_root, self.isolation.limits.pids_root):
            if root is not None:
                with contextlib.suppress(OSError):
                    (root / self.cgroup_name(alloc_id)).rmdir()

    def cgroup_name(self, alloc_id: str) -> str:
        """A member's cgroups, under the server's own: servers on one host may share that cgroup (replicas, a test
        suite's), and allocation ids repeat between them, so the name carries the data directory too (as a
        container's does): one server's limits and cleanup never reach another's members."""
        return images.name(alloc_id, self.data_dir)

    # -- internals -----------------------------------------------------------------------------------------
    def _hidden(self) -> list[str]:
        """Directories of the server's that a workload must not see even where their modes would allow it."""
        out = {str(self.data_dir)}
        with contextlib.suppress(KeyError):
            home = pwd.getpwuid(os.geteuid()).pw_dir
            if home not in ("/", ""):
                out.add(home)
        return sorted(out)

    def _interpreter(self) -> list[str]:
        """bwrap arguments that let a member run this server's Python (notebooks do) where the sandbox's own
        masks, or a private directory above it (pyenv's under root's home, say), would keep it out of reach:
        the closed ancestor becomes an empty tmpfs (nothing in it was the member's to see), and the interpreter's
        tree alone is bound back, read-only."""
        masked = {"/tmp", "/var/tmp", "/run", "/dev/shm", *self._hidden()}
        out: list[str] = []
        for prefix in sorted({sys.prefix, sys.base_prefix}):
            path = Path(prefix)
            chain = [*reversed(path.parents), path][1:]  # from the top, without "/"
            closed = next((a for a in chain if str(a) in masked or not os.stat(a).st_mode & 0o001), None)
            if closed is None:
                continue
            if str(closed) not in masked and closed != path:
                out += ["--tmpfs", str(closed)]
            between = chain[chain.index(closed) + 1 : -1]
            out += [x for a in between for x in ("--perms", "0755", "--dir", str(a))]
            out += ["--ro-bind", prefix, prefix]
        return out

    def _identity_files(self, member: Member) -> tuple[Path, Path]:
        uid = self.uid(member.project_id)
        self._ids.mkdir(mode=0o700, parents=True, exist_ok=True)
        name = f"gpupool-{member.project}"[:32]
        entries = {
            "passwd": f"{name}:x:{uid}:{uid}:gpupool project {member.project}:{member.workdir}:/bin/sh\n",
            "group": f"{name}:x:{uid}:\n",
        }
        out = []
        for kind, line in entries.items():
            # One pair per member: the line names its workdir, so members of one project cannot share a file
            # (replacing it under a sandbox that is binding it fails that member's start).
            path = self._ids / f"{member.alloc_id}.{kind}"
            host = Path(f"/etc/{kind}").read_text()
            text = host + ("" if host.endswith("\n") else "\n") + line
            if not path.exists() or path.read_text() != text:
                tmp = path.with_name(f"{path.name}.{threading.get_native_id()}.tmp")
                tmp.write_text(text)
                os.chmod(tmp, 0o644)
                tmp.replace(path)
            out.append(path)
        # The directory stays the server's (700): bind mounts reach the files without it being traversable.
        return out[0], out[1]

    def _cgroup(self, member: Member) -> tuple[str, ...]:
        limits = self.isolation.limits
        if limits.mode not in ("cgroup-v1", "cgroup-v2") or limits.root is None:
            return ()
        procs: list[str] = []
        mem = limits.root / self.cgroup_name(member.alloc_id)
        cpu = (limits.cpu_root or limits.root) / self.cgroup_name(member.alloc_id)
        pids = (limits.pids_root or limits.root) / self.cgroup_name(member.alloc_id) if limits.pids else None
        for d in {mem, cpu} | ({pids} if pids is not None else set()):
            d.mkdir(exist_ok=True)
            procs.append(str(d / "cgroup.procs"))
        if pids is not None:
            (pids / "pids.max").write_text(str(self.pids_limit))
        if limits.mode == "cgroup-v1":
            if member.memory_mib > 0:
                (mem / "memory.limit_in_bytes").write_text(str(member.memory_mib * 1024 * 1024))
            if member.cpu_milli > 0:
                (cpu / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
                (cpu / "cpu.cfs_quota_us").write_text(str(member.cpu_milli * CPU_PERIOD_US // 1000))
        else:
            if member.memory_mib > 0:
                (mem / "memory.max").write_text(str(member.memory_mib * 1024 * 1024))
            if member.cpu_milli > 0:
                (cpu / "cpu.max").write_text(f"{member.cpu_milli * CPU_PERIOD_US // 1000} {CPU_PERIOD_US}")
        return tuple(sorted(procs))

    def systemd_prefix(self, member: Member) -> tuple[str, ...]:
        """On a systemd host, a transient scope carries the limits (systemd owns the cgroup tree there)."""
        if self.isolation.limits.mode != "systemd":
            return ()
        out = ["systemd-run", "--scope", "--quiet", "--collect", f"--unit=gpupool-{member.alloc_id}"]
        if member.memory_mib > 0:
            out.append(f"--property=MemoryMax={member.memory_mib}M")
        if member.cpu_milli > 0:
            out.append(f"--property=CPUQuota={member.cpu_milli // 10}%")
        out.append(f"--property=TasksMax={self.pids_limit}")
        return (*out, "--")
