"""Workload members as process groups on this host, re-adoptable after a server restart.

Each launch leaves a record in `<data>/run/<alloc id>.json`; a small `sh` wrapper writes the member's exit
status to `<alloc id>.exit`, so an exit is known even if it happened while the server was down.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpupool.backends.base import (
    AppEndpoint,
    Capabilities,
    DeviceSample,
    LaunchSpec,
    MemberSample,
    Observed,
    Sample,
)
from gpupool.backends.local.apps import answers_http
from gpupool.backends.local.gpus import Discovered
from gpupool.backends.local.mps import MpsDaemon, mps_env
from gpupool.backends.local.sandbox import APP_SOCKET, Isolation, Limits, Member, Sandbox
from gpupool.backends.local.telemetry import CpuActivity, NvmlReader, processes, tree
from gpupool.core import Node

# "$1" is the exit file, "$2" the number of cgroup.procs files that follow (the wrapper joins them first, so
# everything the member starts is counted); the rest is the member's argv, run without any shell
# interpretation of its words. The wrapper catches TERM (its child gets the default action back on exec) so
# it outlives the grace period and records how the member really ended. It runs as the server's user, outside
# the sandbox, which is what lets it write the exit file where the member cannot.
_WRAPPER = (
    "trap : TERM INT; f=$1; n=$2; shift 2; rc=0; "
    'while [ "$n" -gt 0 ]; do echo $$ > "$1" || rc=125; shift; n=$((n-1)); done; '
    '[ $rc -eq 0 ] && { "$@"; rc=$?; }; '
    'printf "%s" "$rc" > "$f.tmp" && mv "$f.tmp" "$f"; exit $rc'
)
_BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "USER", "LOGNAME", "SHELL", "TMPDIR", "TERM")
_SANDBOX_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "TERM")
"""What a sandboxed member inherits from the server's environment: its HOME, user and /tmp are its own."""
_DRIVER_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")


@dataclass(slots=True)
class _Run:
    alloc_id: str
    pid: int
    start_ticks: int
    enforced: bool
    devices: tuple[tuple[int, int, int], ...] = ()
    """(index, milli, memory MiB) of each device it holds."""


def _start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


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
    ) -> None:
        self.data_dir = data_dir
        self.isolation = isolation or Isolation(False, Limits("advisory"))
        self.sandbox = Sandbox(data_dir, self.isolation, uid_base)
        self._apps_root = apps_root(data_dir)
        self.node_name = node_name
        self.pool = pool
        self.gpus = gpus
        self._on_exit = on_exit
        self._run_dir = data_dir / "run"
        self._run_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._runs: dict[str, _Run] = {}
        self._children: dict[str, subprocess.Popen[bytes]] = {}
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
            isolation=self.isolation.summary(),
        )
        self._adopt()

    # -- what the host has ---------------------------------------------------------------------------------
    def inventory(self) -> list[Node]:
        cpu = (os.cpu_count() or 1) * 1000
        return [Node(self.node_name, self.pool, cpu, _meminfo_mib(), self.gpus.devices)]

    def capabilities(self) -> Capabilities:
        return self._capabilities

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

    # -- launch, stop, observe -----------------------------------------------------------------------------
    def launch(self, spec: LaunchSpec) -> None:
        with self._lock:
            if spec.alloc_id in self._runs or self._record(spec.alloc_id).exists():
                return
            member = self._member(spec)
            self.sandbox.prepare(member)
            log = Path(self.log_path(spec.workload_id, spec.rank))
            log.parent.mkdir(parents=True, exist_ok=True)
            env, enforced = self._environment(spec, member)
            argv, cgroups = self.sandbox.argv(member, spec.argv)
            exit_file = self._run_dir / f"{spec.alloc_id}.exit"
            with contextlib.suppress(FileNotFoundError):
                exit_file.unlink()
            wrapper = ["/bin/sh", "-c", _WRAPPER, "gpupool-run", str(exit_file), str(len(cgroups)), *cgroups]
            with open(log, "ab") as out:
                proc = subprocess.Popen(
                    [*wrapper, *argv],
                    cwd=member.workdir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
            grants = tuple((d.index, d.milli, d.memory_mib) for d in spec.devices)
            run = _Run(spec.alloc_id, proc.pid, _start_ticks(proc.pid) or 0, enforced, grants)
            self._runs[spec.alloc_id] = run
            self._children[spec.alloc_id] = proc
            tmp = self._record(spec.alloc_id).with_suffix(".tmp")
            record = {"pid": run.pid, "start_ticks": run.start_ticks, "enforced": enforced, "devices": grants}
            tmp.write_text(json.dumps(record))
            tmp.replace(self._record(spec.alloc_id))
        threading.Thread(target=self._reap, args=(proc,), daemon=True, name=f"reap-{spec.alloc_id}").start()

    def stop(self, alloc_id: str, force: bool) -> None:
        with self._lock:
            run = self._runs.get(alloc_id)
        if run is None or not self._alive(run):
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
            exit_file = self._run_dir / f"{run.alloc_id}.exit"
            code: int | None = None
            with contextlib.suppress(OSError, ValueError):
                code = int(exit_file.read_text())
            # Whatever the member left behind in its group goes with it, so its devices are really free.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run.pid, signal.SIGKILL)
            seen[run.alloc_id] = Observed(run.alloc_id, False, code, run.enforced)
        return seen

    def forget(self, alloc_id: str) -> None:
        with self._lock:
            self._runs.pop(alloc_id, None)
            self._children.pop(alloc_id, None)
        for suffix in (".json", ".exit"):
            with contextlib.suppress(FileNotFoundError):
                (self._run_dir / f"{alloc_id}{suffix}").unlink()
        self.sandbox.release(alloc_id)
        shutil.rmtree(self._app_dir(alloc_id), ignore_errors=True)

    def sample(self) -> Sample:
        with self._lock:
            runs = [r for r in self._runs.values() if self._alive(r)]
        procs = processes()
        cpu = self._activity.measure([r.pid for r in runs], procs)
        read = self._nvml.read(len(self.gpus.devices)) if self._nvml is not None else None
        samples: dict[str, MemberSample] = {}
        dev_util: dict[int, float] = {}
        dev_mem: dict[int, int] = {}
        for r in runs:
            if not r.devices:
                continue
            granted = sum(m for _, _, m in r.devices)
            members = tree(procs, r.pid)
            if read is None:  # modelled: a busy process keeps its share busy; memory is its RSS, up to the grant
                util, mem = cpu.get(r.pid, 0), min(granted, sum(p.rss_mib for p in members))
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
        )

    def _record(self, alloc_id: str) -> Path:
        return self._run_dir / f"{alloc_id}.json"

    def _alive(self, run: _Run) -> bool:
        child = self._children.get(run.alloc_id)
        if child is not None:
            return child.poll() is None
        ticks = _start_ticks(run.pid)
        return ticks is not None and ticks == run.start_ticks and not _zombie(run.pid)

    def _adopt(self) -> None:
        """Take back the records of launches made before a restart; their processes kept running."""
        for rec in sorted(self._run_dir.glob("*.json")):
            with contextlib.suppress(OSError, ValueError, KeyError):
                data = json.loads(rec.read_text())
                grants = tuple(tuple(int(x) for x in d) for d in data.get("devices", ()))
                self._runs[rec.stem] = _Run(
                    rec.stem,
                    int(data["pid"]),
                    int(data["start_ticks"]),
                    data["enforced"],
                    grants,  # type: ignore[arg-type]
                )

    def _reap(self, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()
        self._on_exit()

    def _environment(self, spec: LaunchSpec, member: Member) -> tuple[dict[str, str], bool]:
        # A clean environment: the server's own secrets (database URL, tokens) never reach a workload.
        inherited = _SANDBOX_ENV if self.isolation.sandboxed else _BASE_ENV
        env = {k: os.environ[k] for k in inherited if k in os.environ}
        env.update(self.sandbox.home_env(member))
        env.update(spec.secrets)  # the project's secrets; the workload's own variables win on a clash
        env.update(spec.env)
        workdir = member.workdir
        visible = ",".join(str(d.index) for d in spec.devices)
        env.update(
            {
                "CUDA_VISIBLE_DEVICES": visible,
                "NVIDIA_VISIBLE_DEVICES": ",".join(self.gpus.uuids[d.index] for d in spec.devices) or "none",
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "GPUPOOL_WORKLOAD": spec.workload_name,
                "GPUPOOL_PROJECT": spec.project,
                "GPUPOOL_ALLOCATION": spec.alloc_id,
                "GPUPOOL_WORKDIR": str(workdir),
            }
        )
        if spec.port is not None:
            env["PORT"] = str(spec.port)
        if spec.master_port is not None:
            # What torchrun sets, so unmodified DDP scripts work; every member is on this host.
            env.update(
                {
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(spec.master_port),
                    "WORLD_SIZE": str(spec.world_size),
                    "RANK": str(spec.rank),
                    "LOCAL_RANK": str(spec.rank),
                    "LOCAL_WORLD_SIZE": str(spec.world_size),
                    "GROUP_RANK": "0",
                    "ROLE_RANK": str(spec.rank),
                    "ROLE_WORLD_SIZE": str(spec.world_size),
                }
            )
        enforced = False
        fraction = [d for d in spec.devices if d.milli < 1000]
        if fraction:
            d = fraction[0]
            env["GPUPOOL_GPU_FRACTION"] = f"{d.milli / 1000:.3f}"
            env["GPUPOOL_GPU_MEMORY_LIMIT_MIB"] = str(d.memory_mib)
            if self._mps is not None and self._mps.ensure():
                env.update(mps_env(self._mps, d.milli, d.memory_mib))
                enforced = True
        return env, enforced


def apps_root(data_dir: Path) -> Path:
    """Where members' app sockets live. A socket's path has at most 107 bytes, which a data dir deep in a tree
    can exceed; a root server keeps them short under /run, keyed by its data dir."""
    if os.geteuid() != 0:
        root = data_dir / "apps"
    else:
        key = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:16]
        Path("/run/gpupool").mkdir(mode=0o700, exist_ok=True)
        root = Path("/run/gpupool") / key
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return root


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
