"""How busy the GPUs an organisation's jobs hold really are, and what right-sizing advice does to it.

"Busy" is the share of its held time a GPU runs work (what nvidia-smi's utilisation and DCGM's GPU-active
report), not allocation: a GPU held by a job that loads data, writes a checkpoint or waits for its user at a
breakpoint is allocated and idle. Measurements behind the model (all in /work/shared/reference/performance.md,
whose status is repeated here):

- Philly, training jobs (secondary: the affinode.io case study of Philly's released `cluster_gpu_util`): GPUs
  reserved by jobs are fully idle 49% of the time for jobs shorter than 6 h and 25% for jobs longer than 24 h.
- Alibaba PAI 2020, all instances (secondary: the affinode.io analysis of `pai_sensor_table`): GPU utilisation
  mean 10.5%, median 1.5%; 34.5% of instances average 0% and only 5% reach 50%. A whole platform with its idle
  development instances: not fitted per job, a bound to compare with (the model's notebooks, the platform's
  most idle work, are busy about 15% of the time they hold a GPU; the whole cluster's busy share stays above it).
- Uptime Institute (UII 362, 2025): running models reach 35-45% of peak compute; used for services.

The model, per job, drawn once from a generator of its own (so an organisation is the same with or without it):

- training: a busy share drawn from a Beta distribution (concentration 2: nearly uniform, as wide as the
  measured spread) whose mean is 1 - idle share, the idle share 49% up to 6 h, 25% from 24 h and in between
  linear in the logarithm of the runtime. Idle phases (data loading, checkpoints, evaluation, debugging) are
  short beside the simulator's one-minute step, so the share is applied evenly over the job's running time.
- batch sweeps: trials of 10-60 minutes, the short-job Philly figure (mean busy 51%).
- notebooks: busy only while their user is active (the bursts of `org_jobs`, about 15% of a session).
- services: mean busy 40% (the middle of Uptime's 35-45%), Beta with concentration 8 (traffic varies less).
- peak GPU memory, which right-sizing also reads: a share of the grant drawn uniformly from 10% to 100%. No
  anchor in the reference: an assumption, stated as one.

Right-sizing followers (`rightsize`): a given share of the jobs the rule of `services.rightsizing.advise` gives
advice for are submitted with the advised request, as by a user who followed the advice a previous run of the
same work got. The work a job does on its GPU is the same; its busy share of the smaller grant grows to match.
Multi-GPU jobs are taken as data-parallel, every GPU busy at the peak, so the rule's `--gpus k` never applies to
them. Notebooks and services are not resubmitted (a session is opened, not rerun; a service is sized for load).
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import TYPE_CHECKING

from gpupool.core import MILLI
from gpupool.core.rightsizing import Grant, Observed, advise

if TYPE_CHECKING:
    from gpupool.sim.org_jobs import Organisation, OrgJob

HOUR = 3_600.0

DEVICE_MEMORY_MIB = 80 * 1024
"""The simulated cluster's GPUs (H100, 80 GiB)."""
SHORT_S, LONG_S = 6 * HOUR, 24 * HOUR
IDLE_SHORT, IDLE_LONG = 0.49, 0.25
"""Philly: reserved GPUs fully idle this share of the time for jobs under 6 h and over 24 h."""
TRAINING_CONCENTRATION = 2.0
SERVICE_BUSY, SERVICE_CONCENTRATION = 0.40, 8.0
PEAK_MEMORY_SHARE = (0.10, 1.0)


def idle_share(runtime_s: float) -> float:
    """Mean idle share of a training job's held GPU time, by its runtime (the Philly figures)."""
    if runtime_s <= SHORT_S:
        return IDLE_SHORT
    if runtime_s >= LONG_S:
        return IDLE_LONG
    x = math.log(runtime_s / SHORT_S) / math.log(LONG_S / SHORT_S)
    return IDLE_SHORT + x * (IDLE_LONG - IDLE_SHORT)


def _beta(rng: random.Random, mean: float, concentration: float) -> float:
    return rng.betavariate(mean * concentration, (1 - mean) * concentration)


def utilisation(jobs: tuple[OrgJob, ...], seed: int) -> tuple[OrgJob, ...]:
    """Every job with its busy share and peak memory drawn as the module's docstring says."""
    rng = random.Random(f"utilisation-{seed}")
    out = []
    for job in jobs:
        if job.kind in ("training", "batch"):
            busy = _beta(rng, 1 - idle_share(job.work), TRAINING_CONCENTRATION)
        elif job.kind == "inference":
            busy = _beta(rng, SERVICE_BUSY, SERVICE_CONCENTRATION)
        else:
            busy = job.busy_fraction  # notebooks: their bursts say when they are busy
        out.append(replace(job, busy_fraction=busy, peak_memory_share=rng.uniform(*PEAK_MEMORY_SHARE)))
    return tuple(out)


def advised_milli(job: OrgJob) -> int | None:
    """The per-worker request the right-sizing rule advises for one job run whole, or None."""
    if job.kind not in ("training", "batch"):
        return None
    per_worker = job.milli // job.members
    memory = per_worker * DEVICE_MEMORY_MIB // MILLI
    grant = Grant(per_worker // MILLI if per_worker >= MILLI else 0, per_worker, memory, DEVICE_MEMORY_MIB)
    held = per_worker * job.work
    seen = Observed(
        minutes=int(job.work // 60),
        milli_seconds=held,
        busy_milli_seconds=held * job.busy_fraction,
        peak_memory_mib=math.ceil(memory * job.peak_memory_share),
        peak_util_pct=100,
    )
    advice = advise(grant, job.members, seen)
    return advice.advised_milli if advice is not None else None


def rightsize(org: Organisation, followers_pct: float, seed: int) -> Organisation:
    """The organisation where `followers_pct` percent of the jobs that get advice follow it (drawn per job)."""
    rng = random.Random(f"rightsizing-{seed}")
    jobs = []
    for job in org.jobs:
        milli = advised_milli(job)
        if milli is not None and rng.random() * 100 < followers_pct:
            before = job.milli // job.members
            job = replace(job, gpus=0, gpu_milli=milli, busy_fraction=job.busy_fraction * before / milli)
        jobs.append(job)
    return replace(org, jobs=tuple(jobs))


def followed(org: Organisation, rightsized: Organisation) -> int:
    """How many jobs were resubmitted smaller."""
    return sum(1 for a, b in zip(org.jobs, rightsized.jobs, strict=True) if a.milli != b.milli)
