"""The environment a local member starts with: a clean one (the server's own secrets never reach a workload), the
project's secrets, the workload's variables, and what gpupool sets (devices, ranks, its workdir)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from gpupool.backends.base import LaunchSpec
from gpupool.backends.local.mps import MpsDaemon, mps_env
from gpupool.backends.local.sandbox import Member, Sandbox

BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "USER", "LOGNAME", "SHELL", "TMPDIR", "TERM")
SANDBOX_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "TERM")
"""What a sandboxed member inherits from the server's environment: its HOME, user and /tmp are its own."""


def member_environment(
    spec: LaunchSpec, member: Member, sandbox: Sandbox, uuids: Sequence[str], mps: MpsDaemon | None
) -> tuple[dict[str, str], bool]:
    """The member's environment, and whether its GPU fraction is enforced (MPS)."""
    # A clean environment: the server's own secrets (database URL, tokens) never reach a workload.
    inherited = SANDBOX_ENV if sandbox.isolation.sandboxed else BASE_ENV
    env = {k: os.environ[k] for k in inherited if k in os.environ}
    env.update(sandbox.home_env(member))
    env.update(spec.secrets)  # the project's secrets; the workload's own variables win on a clash
    env.update(spec.env)
    workdir = member.workdir
    visible = ",".join(str(d.index) for d in spec.devices)
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": visible,
            "NVIDIA_VISIBLE_DEVICES": ",".join(uuids[d.index] for d in spec.devices) or "none",
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
        if mps is not None and mps.ensure():
            env.update(mps_env(mps, d.milli, d.memory_mib))
            enforced = True
    return env, enforced
