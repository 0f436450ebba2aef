"""Turning a submitted workload into a core request, and refusing what could never run, before anything is written."""

from __future__ import annotations

import re
from collections.abc import Sequence

from gpupool.core import MILLI, Request
from gpupool.core.feasibility import ever_fits, members_on_empty, node_groups, states_of
from gpupool.core.priority import DEFAULT_CLASSES, PriorityClass, class_named
from gpupool.core.quota import gpu_count
from gpupool.core.state import NodeState
from gpupool.models import sizes
from gpupool.models.schemas import WorkloadCreate
from gpupool.services.errors import Invalid
from gpupool.store.snapshot import core_node
from gpupool.store.tables import NodeRow, QueueRow

TYPE_CLASS = {"notebook": "interactive", "training": "training", "inference": "production", "batch": "batch"}
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# The environment a workload may not set, declared once. Either gpupool sets it (rendezvous, ports, the GPUs a
# process sees and how MPS limits it, notebook tokens), or it changes how the programs gpupool starts load code
# (the dynamic loader, the search path, interpreters' and shells' start-up files). Matched case-sensitively,
# as the kernel passes them.
DENIED_ENV = frozenset(
    {
        *("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"),
        *("ROLE_RANK", "ROLE_WORLD_SIZE", "PORT"),
        *("PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "BASH_ENV", "ENV"),
    }
)
DENIED_ENV_PREFIXES = ("LD_", "CUDA_", "NVIDIA_", "JUPYTER_", "JUPYTERHUB_", "GPUPOOL_")
"""CUDA_ covers CUDA_VISIBLE_DEVICES and CUDA_MPS_*, and CUDA_DEVICE_ORDER, which would renumber the devices
CUDA_VISIBLE_DEVICES names; NVIDIA_ covers the container runtime's NVIDIA_VISIBLE_DEVICES and
NVIDIA_DRIVER_CAPABILITIES."""
ANY_MODEL: frozenset[str] = frozenset()
"""A submitted workload names no GPU model."""


def parse_mib(text: str, what: str) -> int:
    """'16GB' (10^9 bytes each), '16GiB' (2^30), '512Mi' -> MiB, rounded up (gpupool.models.sizes)."""
    try:
        return sizes.parse_mib(text)
    except ValueError as e:
        raise Invalid(f"{what} {e}") from None


def env_denied(key: str) -> bool:
    return key in DENIED_ENV or key.startswith(DENIED_ENV_PREFIXES)


def priority_of(body: WorkloadCreate, classes: Sequence[PriorityClass] = DEFAULT_CLASSES) -> PriorityClass:
    name = body.priority or TYPE_CLASS[body.type]
    try:
        return class_named(name, tuple(classes))
    except KeyError as e:
        raise Invalid(str(e.args[0])) from None


def to_request(body: WorkloadCreate) -> Request:
    forms = [x is not None for x in (body.gpu, body.gpus, body.gpu_memory)]
    if sum(forms) > 1:
        raise Invalid("ask for one of gpu (a fraction), gpus (whole GPUs) or gpu_memory, not several")
    gpus = body.gpus or 0
    milli = 0
    if body.gpu is not None:
        if not 0 < body.gpu < 1:
            # Named as the API and a workload file name them, and as the CLI's flag: the same refusal reaches all three.
            raise Invalid(
                f"gpu {body.gpu:g} is not a fraction between 0 and 1; ask for whole GPUs with gpus (--gpus in the CLI)"
            )
        milli = max(1, min(999, round(body.gpu * MILLI)))
    memory = parse_mib(body.gpu_memory, "gpu_memory") if body.gpu_memory is not None else 0
    cpu = round(body.cpu * 1000) if body.cpu is not None else 0
    host_mem = parse_mib(body.memory, "memory") if body.memory is not None else 0
    return Request(gpus=gpus, gpu_milli=milli, gpu_memory_mib=memory, cpu_milli=cpu, memory_mib=host_mem)


def check_text(body: WorkloadCreate) -> None:
    for key, value in body.env.items():
        if not ENV_KEY.fullmatch(key):
            raise Invalid(f"environment variable name {key[:80]!r} is not valid")
        if env_denied(key):
            raise Invalid(
                f"environment variable {key!r} is reserved: it is set by gpupool, or it changes how the "
                "programs gpupool starts load code (LD_*, PATH, PYTHONPATH, BASH_ENV, ...); use another name"
            )
        if "\x00" in value or len(value) > 32_768:
            raise Invalid(f"environment variable {key!r} has a NUL byte or is longer than 32 KiB")
    if any("\x00" in arg for arg in body.command) or sum(len(a) for a in body.command) > 131_072:
        raise Invalid("the command has a NUL byte or is longer than 128 KiB")
    if body.type == "notebook":
        if body.command:
            raise Invalid("a notebook runs JupyterLab; it takes no command")
        if body.workers > 1:
            raise Invalid("a notebook has one member; workers is for training")
    elif not body.command and body.model is None:
        raise Invalid(f"a {body.type} workload needs a command (after --)")
    if body.workers > 1 and body.type not in ("training", "batch"):
        raise Invalid("only training and batch workloads can have several workers")


def _never(req: Request, workers: int, groups: list[list[NodeState]]) -> str:
    """Why a workload the core says could never fit (`feasibility.ever_fits`) never can, in the user's terms."""
    nodes = [n for group in groups for n in group]
    if req.gpus:
        most = max((len(n.devices) for n in nodes), default=0)
        if req.gpus > most:
            return f"{gpu_count(req.gpus * MILLI)} on one node: no node has more than {most}"
    if req.gpu_memory_mib:
        most = max((d.memory for n in nodes for d in n.devices), default=0)
        if req.gpu_memory_mib > most:
            return f"{req.gpu_memory_mib} MiB of GPU memory: no device has more than {most} MiB"
    if (req.gpu_milli or req.gpu_memory_mib) and not any(n.devices for n in nodes):
        return "no node has a GPU"
    if not any(members_on_empty(n, req, ANY_MODEL) for n in nodes):
        return "no node has the CPU or memory it asks for"
    if len({n.cluster for n in nodes}) > 1:
        where = " in one pool of one cluster (a gang never spans pools or clusters)"
    else:
        where = " in one pool (a gang never spans pools)" if len(groups) > 1 else ""
    return f"{workers} workers of this size: the cluster cannot hold them all at once{where}"


def check_fits(
    req: Request,
    workers: int,
    pools: Sequence[str],
    preemptible: bool,
    nodes: Sequence[NodeRow],
    chain: Sequence[QueueRow],
    gpu_models: Sequence[str] = (),
    clusters: Sequence[str] = (),
    cluster_names: Sequence[str] = (),
) -> None:
    """Refuse at submit what could never run: unknown pools, clusters or GPU models, bigger than any node, over a
    hard limit, or not preemptible and beyond what the project (or a department above it) is guaranteed.
    `cluster_names`: every cluster of the fleet (a spoke not reached yet has no nodes, and may be named)."""
    fleet = sorted({*cluster_names, *(n.cluster for n in nodes)} - {""})
    for cluster in clusters:
        if cluster not in fleet:
            raise Invalid(f"unknown cluster {cluster!r}; clusters: {', '.join(fleet) or 'none'}")
    if clusters:
        nodes = [n for n in nodes if n.cluster in clusters]
    known = sorted({n.pool for n in nodes})
    for pool in pools:
        if pool not in known:
            raise Invalid(f"unknown pool {pool!r}; pools: {', '.join(known) or 'none yet'}")
    states = states_of(core_node(n) for n in nodes)
    models = frozenset(gpu_models)
    have = sorted({m for s in states for m in s.models})
    for model in gpu_models:
        if model not in have:
            raise Invalid(f"no node has GPU model {model!r}; models: {', '.join(have) or 'none yet'}")
    groups = node_groups(states, pools, workers > 1, models, clusters)
    if not ever_fits(groups, req, workers, models):
        raise Invalid(f"this can never run: {_never(req, workers, groups)}")
    total = req.nominal_milli() * workers
    if not total:
        return
    candidate_pools = list(pools) or known
    for pool in candidate_pools:
        ok = True
        for queue in chain:
            quota = next((q for q in queue.quotas if q.pool == pool), None)
            if quota is None:
                if not preemptible:
                    ok = False
                continue
            if quota.limit_milli is not None and total > quota.limit_milli:
                ok = False
            if not preemptible and total > quota.deserved_milli:
                ok = False
        if ok:
            return
    if preemptible:
        raise Invalid(f"this can never run: {gpu_count(total)} is over the hard limit of {chain[0].name!r}")
    raise Invalid(
        f"this can never run: not preemptible, and {gpu_count(total)} is more than "
        f"{chain[0].name!r} (or its department) is guaranteed; ask for less or make it preemptible"
    )
