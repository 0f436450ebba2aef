"""Workload members as process groups on this host, launched exactly once and re-adoptable after a restart.

A launch's intent is durable before its process starts, and a lock file its wrapper holds for as long as it
lives tells a restarted server what became of it: running, ended (with its status), or never started (see
runs.py). One reaper thread learns of every member's end through pidfds (reaper.py). Launches of different
allocations run in parallel; the backend's lock guards its tables only, never a process start or a file write.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from gpupool.backends.base import (
    AppEndpoint,
    Capabilities,
    DeviceSample,
    FilesTarget,
    LaunchSpec,
    MemberSample,
    Observed,
    Sample,
    VolumeSpec,
)
from gpupool.backends.local import envfd
from gpupool.backends.local.apps import answers_http, apps_root
from gpupool.backends.local.files import WorkdirFiles
from gpupool.backends.local.gpus import Discovered
from gpupool.backends.local.launchenv import member_environment
from gpupool.backends.local.mps import MpsDaemon
from gpupool.backends.local.netns import NetworkError, Networks, attempt_key, sweep
from gpupool.backends.local.reaper import Reaper
from gpupool.backends.local.runs import Found, Record, RunDir, start_ticks
from gpupool.backends.local.sandbox import APP_SOCKET, Isolation, Limits, Member, Sandbox
from gpupool.backends.local.telemetry import CpuActivity, NvmlReader, processes, tree
from gpupool.backends.local.volumes import Volumes, loop_mounts_work, volume_words
from gpupool.backends.local.workdirs import Blobs, CodePlacer, discard
from gpupool.core import Node
from gpupool.failpoints import failpoint

log = logging.getLogger(__name__)

_DRIVER_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
DEFAULT_GRACE_S = 30.0
"""The grace of a launch whose record predates graces in records."""


@dataclass(slots=True)
class _Run:
    alloc_id: str
    pid: int | None
    """The wrapper's (its process group is the member's); None for one adopted whose wrapper was not found."""
    start_ticks: int | None
    enforced: bool
    devices: tuple[tuple[int, int, int], ...] = ()
    """(index, milli, memory MiB) of each device it holds."""
    child: subprocess.Popen[bytes] | None = None
    """Set where this server started it: its return code is the best word on how it ended."""
    ended: bool = False
    """An adopted one's end, as the reaper saw it."""
    swept: bool = False
    """Whether what it left in its process group was killed (once: after that its pid may be another's)."""
    grace_s: float = DEFAULT_GRACE_S
    stop_asked: bool = False
    """Whether its container was asked to stop (once: podman keeps the grace clock from there)."""


def _meminfo_mib() -> int:
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 0


class LocalBackend:
    def __init__(
        self,
        data_dir: Path,
        node_name: str,
        pool: str,
        gpus: Discovered,
        on_exit: Callable[[], None] = lambda: None,
        isolation: Isolation | None = None,
        uid_base: int = 1_900_000_000,
        adopt: bool = True,
        pids_limit: int = 4096,
        api_port: int | None = None,
    ) -> None:
        """`adopt=False`: one of several servers on this host and data dir, not leading yet. It reads logs and
        reaches apps but takes up no run record (the leader is writing them) until `adopt()`, on taking over."""
        self.data_dir = data_dir
        self.isolation = isolation or Isolation(False, Limits("advisory"))
        self.sandbox = Sandbox(data_dir, self.isolation, uid_base, pids_limit)
        self.networks = Networks(data_dir / "netns", (api_port,) if api_port else ())
        self._apps_root = apps_root(data_dir)
        self.node_name = node_name
        self.pool = pool
        self.gpus = gpus
        self._on_exit = on_exit
        self._dir = RunDir(data_dir / "run")
        self._code = CodePlacer(data_dir / "workloads", Blobs(data_dir))
        self.volumes = Volumes(data_dir, loop_mounts_work())
        self._lock = threading.Lock()
        """Guards the tables below, and nothing else: no process start or file write happens under it."""
        self._runs: dict[str, _Run] = {}
        self._launching: dict[str, threading.Event] = {}
        self._sandbox_lock = threading.Lock()
        self._reaper = Reaper(self._ended)
        self._mps: MpsDaemon | None = None
        if not gpus.simulated and shutil.which("nvidia-cuda-mps-control"):
            self._mps = MpsDaemon(data_dir / "mps")
        self._activity = CpuActivity()
        self._nvml: NvmlReader | None = None
        if not gpus.simulated:
            with contextlib.suppress(Exception):  # no driver after all: the model stands in
                self._nvml = NvmlReader()
        notebooks = _has_module("jupyterlab")
        if notebooks and self.isolation.sandboxed:
            notebooks = self.sandbox.runs_python("jupyterlab")
        self._capabilities = Capabilities(
            "local",
            fractions_enforced=self._mps is not None,
            notebooks=notebooks,
            extra={"gpus": "simulated" if gpus.simulated else "nvml"},
            isolation={**self.isolation.summary(pids_limit), "volumes": volume_words(self.volumes.enforced)},
            storage=self,
        )
        if adopt:
            self._adopt()

    # -- what the host has ---------------------------------------------------------------------------------
    def inventory(self) -> list[Node]:
        cpu = (os.cpu_count() or 1) * 1000
        return [Node(self.node_name, self.pool, cpu, _meminfo_mib(), self.gpus.devices)]

    def capabilities(self) -> Capabilities:
        return self._capabilities

    def discard(self, workload_id: int) -> None:
        """A deleted workload's files go (the API's delete asks; a live workload's are never asked for)."""
        discard(self.data_dir, workload_id)
        self._code.forget(workload_id)
        self._collected(workload_id).unlink(missing_ok=True)

    def delete_volume(self, volume: VolumeSpec) -> None:
        """A deleted volume's storage goes: unmounted, its image removed."""
        self.volumes.remove(volume.project, volume.name)

    def workload_files(self, target: FilesTarget) -> WorkdirFiles | None:
        """Its working directory (every member's on this host), for `cp`; None where there is none (any more)."""
        root = self.workdir(target.workload_id)
        if not root.is_dir():
            return None
        return WorkdirFiles(str(root), self.sandbox.uid(target.project_id) if self.isolation.sandboxed else None)

    def workdir_ids(self) -> list[int]:
        """The workloads that have a working directory here."""
        root = self.data_dir / "workloads"
        return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.is_dir() else []

    def collect_workdir(self, workload_id: int) -> None:
        """A finished workload's working directory goes once its retention is over (its logs stay)."""
        mark = self._collected(workload_id)
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.touch()
        shutil.rmtree(self.workdir(workload_id), ignore_errors=True)
        self._code.forget(workload_id)

    def workdir_collected(self, workload_id: int) -> bool:
        """Whether its working directory was removed at the end of its retention."""
        return self._collected(workload_id).exists()

    def _collected(self, workload_id: int) -> Path:
        return self.data_dir / "workloads" / f"{workload_id}.collected"

    def log_path(self, workload_id: int, rank: int) -> str:
        return str(self.data_dir / "logs" / str(workload_id) / f"rank-{rank}.log")

    def healthy(self, alloc_id: str, port: int | None) -> bool:
        if port is None:
            return True
        return answers_http(self.app_endpoint(alloc_id, port))

    def app_endpoint(self, alloc_id: str, port: int | None) -> AppEndpoint:
        """Where the server's proxy reaches a member's app: its socket, or (not sandboxed, a service) its port."""
        sock = self._app_dir(alloc_id) / APP_SOCKET
        if self.isolation.sandboxed or port is None or sock.exists():
            return AppEndpoint(uds=str(sock))
        return AppEndpoint(host="127.0.0.1", port=port)

    def app_socket(self, alloc_id: str) -> str:
        """Where a notebook is to listen, as the notebook sees it."""
        return self.sandbox.app_socket(self._app_dir(alloc_id))

    def read_log(self, workload_id: int, rank: int, offset: int, limit: int) -> bytes:
        try:
            with open(self.log_path(workload_id, rank), "rb") as f:
                if offset >= os.fstat(f.fileno()).st_size:
                    return b""  # past its end, maybe past what the filesystem can seek to: nothing yet
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            return b""

    def workdir(self, workload_id: int) -> Path:
        return self.data_dir / "workloads" / str(workload_id)

    def wrapper_pid(self, alloc_id: str) -> int | None:
        """A running member's wrapper (its processes descend from it); None where none is known to run here."""
        with self._lock:
            run = self._runs.get(alloc_id)
        return None if run is None or run.ended else run.pid

    # -- launch, stop, observe -----------------------------------------------------------------------------
    def launch(self, spec: LaunchSpec) -> None:
        """Start the member once: a launch of an allocation already known (here, or on disk from before a
        restart) returns; two at once for one allocation start it once (the second waits for the first)."""
        while True:
            with self._lock:
                if spec.alloc_id in self._runs:
                    return
                under_way = self._launching.get(spec.alloc_id)
                if under_way is None:
                    done = self._launching[spec.alloc_id] = threading.Event()
                    break
            under_way.wait()
        try:
            self._launch(spec)
        finally:
            with self._lock:
                del self._launching[spec.alloc_id]
            done.set()

    def _launch(self, spec: LaunchSpec) -> None:
        alloc_id = spec.alloc_id
        lock_fd = self._dir.claim(alloc_id)
        if lock_fd is None:  # its wrapper runs: started before a restart, or by another server on this data dir
            found = self._dir.survey(alloc_id)
            if found is None:
                raise RuntimeError(f"launch {alloc_id}: its lock was busy; it never started, and starts next time")
            self._track(alloc_id, found)
            return
        try:
            known = self._dir.read(alloc_id)
            if self._dir.started(alloc_id, lock_fd, known):  # it ran, and ended, before this server knew of it
                self._track(alloc_id, Found(known or Record(), False, None, None))
                return
            try:
                proc, record = self._start(spec, lock_fd)
            except BaseException:
                self._release_network(alloc_id)  # made for it, where no other member of its attempt uses it
                raise
        finally:
            os.close(lock_fd)  # the wrapper's copy keeps the lock for as long as it lives
        try:
            pidfd = os.pidfd_open(proc.pid)  # before anything can reap it: the pid is still this process's
        except ProcessLookupError:  # pragma: no cover - an unreaped child keeps its pid
            pidfd = None
        ticks = start_ticks(proc.pid)
        with self._lock:
            self._runs[alloc_id] = _Run(
                alloc_id, proc.pid, ticks, record.enforced, record.devices, child=proc, grace_s=spec.grace_s
            )
        if pidfd is not None:
            self._reaper.watch(alloc_id, pidfd, proc)
        failpoint("launch.after-start")
        try:
            self._dir.write_record(alloc_id, replace(record, pid=proc.pid, start_ticks=ticks))
        except OSError as e:
            # It runs and is tracked; a restarted server finds it by its lock. Failing the launch now would only
            # have the controller ask again.
            log.warning("launch %s: its record could not be written (%s); it runs, tracked by its lock", alloc_id, e)

    def _start(self, spec: LaunchSpec, lock_fd: int) -> tuple[subprocess.Popen[bytes], Record]:
        """The intent made durable, then the wrapper started holding the lock (`lock_fd` as its stdin)."""
        member = self._member(spec)
        owner = self._owner(spec)
        if member.mounts and self.isolation.sandboxed:  # (a refused mount is said by the sandbox's command)
            for v in spec.volumes:
                self.volumes.ensure(v.project, v.name, v.size_bytes, owner)
        code = spec.code
        if code is not None:  # under the launch's lock and before its intent: see workdirs.py
            self._code.place(spec.workload_id, code, member.workdir, owner)
        self.sandbox.prepare(member)
        if member.network is not None:
            try:
                self.networks.ensure(spec.alloc_id)
            except (NetworkError, OSError, subprocess.SubprocessError) as e:
                raise RuntimeError(f"launch {spec.alloc_id}: {e}") from e
        log_file = Path(self.log_path(spec.workload_id, spec.rank))
        log_file.parent.mkdir(parents=True, exist_ok=True)
        env, enforced = member_environment(spec, member, self.sandbox, self.gpus.uuids, self._mps)
        env_fd = envfd.seal_env(env)
        try:
            if self.isolation.sandboxed:
                with self._sandbox_lock:  # it rewrites a project's identity files, which its members share
                    argv, cgroups = self.sandbox.argv(member, spec.argv, env_fd)
            else:
                argv, cgroups = self.sandbox.argv(member, spec.argv, env_fd)
            record = Record(
                tuple((d.index, d.milli, d.memory_mib) for d in spec.devices), enforced, grace_s=spec.grace_s
            )
            with contextlib.suppress(FileNotFoundError):
                self._dir.exit_path(spec.alloc_id).unlink()
            self._dir.write_intent(spec.alloc_id, record)
            failpoint("launch.before-start")
            with open(log_file, "ab") as out:
                # Everything up to the member's own command runs as root: with the server's fixed environment
                # only, the member's reaching its command through env_fd (envfd.py).
                proc = subprocess.Popen(
                    [*self._dir.wrapper(spec.alloc_id, cgroups), *argv],
                    cwd=member.workdir,
                    env=envfd.ROOT_ENV,
                    stdin=lock_fd,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=(env_fd,),
                )
        finally:
            os.close(env_fd)
        return proc, record

    def stop(self, alloc_id: str, force: bool) -> None:
        with self._lock:
            run = self._runs.get(alloc_id)
        if run is None or run.pid is None or not self._alive(run):
            return
        if not force and self.sandbox.in_container(alloc_id):
            if not run.stop_asked:
                run.stop_asked = True
                self.sandbox.stop(alloc_id, run.grace_s)
            return
        members = tree(processes(), run.pid)
        if not force and self.isolation.sandboxed:
            # TERM goes to the member's own processes only: the sandbox's keepers (root) would take it as a
            # kill and tear the member down before its grace period.
            me = os.geteuid()
            for p in members:
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{p.pid}").st_uid != me:
                        os.kill(p.pid, signal.SIGTERM)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(run.pid, signal.SIGKILL if force else signal.SIGTERM)
        # Descendants that left the group (a Jupyter kernel has a session of its own) are signalled too.
        for p in members[1:] if force else ():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p.pid, signal.SIGKILL)

    def observe(self) -> dict[str, Observed]:
        with self._lock:
            runs = list(self._runs.values())
        seen: dict[str, Observed] = {}
        for run in runs:
            if self._alive(run):
                seen[run.alloc_id] = Observed(run.alloc_id, True, enforced=run.enforced)
                continue
            # Whatever the member left behind in its group goes with it, so its devices are really free.
            if run.pid is not None and not run.swept:
                run.swept = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(run.pid, signal.SIGKILL)
            code = self._exit_code(run)
            reason = self._dir.reason(run.alloc_id) if code != 0 else None
            seen[run.alloc_id] = Observed(run.alloc_id, False, code, run.enforced, reason=reason)
        return seen

    def forget(self, alloc_id: str) -> None:
        with self._lock:
            self._runs.pop(alloc_id, None)
        self._dir.remove(alloc_id)
        self.sandbox.release(alloc_id)
        self._release_network(alloc_id)
        shutil.rmtree(self._app_dir(alloc_id), ignore_errors=True)

    def close(self) -> None:
        """Stop supervising (members run on; a new backend on this data dir adopts them)."""
        self._reaper.close()

    def sample(self) -> Sample:
        with self._lock:
            runs = [(r, r.pid) for r in self._runs.values() if r.pid is not None and self._alive(r)]
        procs = processes()
        cpu = self._activity.measure([pid for _, pid in runs], procs)
        read = self._nvml.read(len(self.gpus.devices)) if self._nvml is not None else None
        samples: dict[str, MemberSample] = {}
        dev_util: dict[int, float] = {}
        dev_mem: dict[int, int] = {}
        for r, pid in runs:
            if not r.devices:
                continue
            granted = sum(m for _, _, m in r.devices)
            members = tree(procs, pid)
            if read is None:  # modelled: a busy process keeps its share busy; memory is its RSS, up to the grant
                util, mem = cpu.get(pid, 0), min(granted, sum(p.rss_mib for p in members))
            else:
                devices, per_pid = read
                util = round(sum(devices[i][0] for i, _, _ in r.devices) / len(r.devices))
                mem = sum(per_pid.get(p.pid, 0) for p in members)
            samples[r.alloc_id] = MemberSample(util, mem)
            for index, milli, memory in r.devices:
                dev_util[index] = dev_util.get(index, 0.0) + util * milli / 1000
                dev_mem[index] = dev_mem.get(index, 0) + mem * memory // max(1, granted)
        devices_out = []
        for d in self.gpus.devices:
            util_pct, used = round(dev_util.get(d.index, 0.0)), dev_mem.get(d.index, 0)
            if read is not None:
                util_pct, used = read[0][d.index]
            devices_out.append(
                DeviceSample(self.node_name, d.index, self.gpus.uuids[d.index], d.model, min(100, util_pct), used)
            )
        return Sample(samples, tuple(devices_out), modelled=read is None)

    # -- internals -----------------------------------------------------------------------------------------
    def _app_dir(self, alloc_id: str) -> Path:
        return self._apps_root / alloc_id

    def _member(self, spec: LaunchSpec) -> Member:
        network = resolv = None
        if self.isolation.sandboxed and not spec.host_network:
            network, resolv = str(self.networks.path(spec.alloc_id)), str(self.networks.resolv(spec.alloc_id))
        devices: tuple[str, ...] = ()
        if spec.devices and not self.gpus.simulated:
            devices = (*_DRIVER_NODES, *(self.gpus.device_node(d.index) for d in spec.devices))
        return Member(
            alloc_id=spec.alloc_id,
            project_id=spec.project_id,
            project=spec.project,
            workdir=self.workdir(spec.workload_id),
            app_dir=self._app_dir(spec.alloc_id),
            private_network=spec.kind == "inference",
            port=spec.port,
            cpu_milli=spec.cpu_milli,
            memory_mib=spec.memory_mib,
            devices=devices,
            shared=(str(self._mps.pipe_dir), str(self._mps.log_dir)) if self._mps is not None else (),
            image=spec.image,
            kind=spec.kind,
            init=spec.init,
            network=network,
            resolv=resolv,
            mounts=tuple((str(self.volumes.paths(v.project, v.name)[0]), v.path, v.read_only) for v in spec.volumes),
        )

    def _release_network(self, alloc_id: str) -> None:
        """The attempt's network removed, unless another of its members (a gang's) runs or is being launched."""
        if not self.isolation.sandboxed:
            return
        key = attempt_key(alloc_id)
        with self._lock:
            others = [a for a in (*self._runs, *self._launching) if a != alloc_id and attempt_key(a) == key]
        if not others:
            self.networks.release(alloc_id)

    def _owner(self, spec: LaunchSpec) -> int | None:
        return self.sandbox.uid(spec.project_id) if self.isolation.sandboxed else None

    def _alive(self, run: _Run) -> bool:
        if run.child is not None:
            return run.child.poll() is None
        if run.pid is None:  # adopted, its wrapper not found: alive while something holds its lock
            return self._dir.held(run.alloc_id)
        return not run.ended

    def _exit_code(self, run: _Run) -> int | None:
        """The best word on how it ended: this server's child's return code, else the wrapper's exit file (none
        where the wrapper itself was killed, or could not write it)."""
        code = run.child.returncode if run.child is not None else None
        return code if code is not None and code >= 0 else self._dir.exit_code(run.alloc_id)

    def _ended(self, alloc_id: str) -> None:
        """The reaper saw a member's wrapper end."""
        with self._lock:
            run = self._runs.get(alloc_id)
            if run is not None:
                run.ended = True
        self._on_exit()

    def _track(self, alloc_id: str, found: Found) -> None:
        """Take over a launch found on disk: one that runs is watched, one that ended is reported as such."""
        run = _Run(alloc_id, found.pid, found.start_ticks, found.record.enforced, found.record.devices)
        if found.record.grace_s is not None:
            run.grace_s = found.record.grace_s
        run.ended = not found.running
        with self._lock:
            self._runs[alloc_id] = run
        if found.running and found.pid is None:
            log.warning("launch %s runs (its lock is held), but its wrapper was not found to stop it", alloc_id)
        if not found.running or found.pid is None:
            return
        try:
            pidfd = os.pidfd_open(found.pid)
        except ProcessLookupError:
            run.ended = True
            return
        if start_ticks(found.pid) != found.start_ticks:  # it ended and its pid went to another process
            os.close(pidfd)
            run.ended = True
            return
        self._reaper.watch(alloc_id, pidfd)
        if found.record.pid != found.pid:  # found by its lock: the record learns its pid (a hint, best effort)
            with contextlib.suppress(OSError):
                self._dir.write_record(alloc_id, replace(found.record, pid=found.pid, start_ticks=found.start_ticks))

    def adopt(self) -> None:
        """Take up every launch the run records name: at start, or when this server takes the lead."""
        self._adopt()

    def _adopt(self) -> None:
        """Take back the launches made before a restart: running ones, ended ones (how they ended), and the
        intents of ones that never started, which are dropped so that the controller's next launch starts them."""
        self._dir.sweep()
        for alloc_id in self._dir.allocations():
            found = self._dir.survey(alloc_id)
            if found is not None:
                self._track(alloc_id, found)
        if self.isolation.sandboxed:  # networks of attempts no record names (a crash between making and starting)
            with self._lock:
                runs = list(self._runs.items())
            sweep(self.networks.root, frozenset(attempt_key(a) for a, _ in runs))
            for alloc_id in (a for a, r in runs if self._alive(r)):
                try:
                    self.networks.revive(alloc_id)
                except (NetworkError, OSError, subprocess.SubprocessError) as e:
                    log.warning("member %s: its network's way out could not be started again (%s)", alloc_id, e)


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
