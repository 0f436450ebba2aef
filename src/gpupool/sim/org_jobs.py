"""The work of an organisation over time: Philly training jobs plus a documented synthetic mix.

Philly's 15 virtual clusters become 15 projects in 5 departments. On top of that, each department runs
long-lived inference services, and each project has data scientists opening notebooks (a fraction of a GPU,
busy in short bursts, idle most of the time) and batch sweeps (many short 1-GPU trials). All of it is drawn
from a seeded generator, so a seed gives the same organisation every time.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

from gpupool.sim.org_util import utilisation
from gpupool.sim.traces import PhillyJob

DAY = 86_400.0
HOUR = 3_600.0
MEMBER_GPUS = 8
"""Philly jobs of more than 8 GPUs become gangs of 8-GPU members."""


@dataclass(frozen=True, slots=True)
class Burst:
    start: float
    end: float


@dataclass(frozen=True)
class OrgJob:
    id: str
    project: str
    kind: str
    """training, batch, notebook or inference: the workload type, which sets its priority class."""
    submit: float
    work: float
    """Seconds of running it needs (for notebooks and services: how long the session or service lasts)."""
    gpus: int = 0
    gpu_milli: int = 0
    members: int = 1
    bursts: tuple[Burst, ...] = field(default_factory=tuple)
    """Notebooks: when the user is active (GPU busy); idle in between."""
    busy_fraction: float = 1.0
    """Share of running time the GPU is busy, for work without bursts (`org_util`)."""
    peak_memory_share: float = 1.0
    """Its peak GPU memory over what it holds (`org_util`), which right-sizing advice reads."""
    declared: float | None = None
    """The maximum duration its user declared (`declare`); None: none (services, and work longer than allowed)."""

    @property
    def milli(self) -> int:
        return (self.gpus * 1000 or self.gpu_milli) * self.members


@dataclass(frozen=True)
class Organisation:
    departments: dict[str, tuple[str, ...]]
    deserved_gpus: dict[str, int]
    """Per project, whole GPUs; departments hold the sum of their projects."""
    jobs: tuple[OrgJob, ...]


DEFAULT_START_DAY = 35
"""The trace's first three weeks are nearly empty; from day 35 (9 October 2017) it is busy."""


def build(
    trace: tuple[PhillyJob, ...],
    gpus: int,
    days: float,
    seed: int,
    target_load: float = 0.9,
    start_day: float = DEFAULT_START_DAY,
) -> Organisation:
    """An organisation sized to `gpus`: `days` of Philly from `start_day`, sampled so that with the synthetic
    work the demand is `target_load` of the GPUs; quotas proportional to each team's demand."""
    rng = random.Random(seed)
    horizon = days * DAY
    offset = start_day * DAY
    window = [replace(j, submit_s=j.submit_s - offset) for j in trace if offset <= j.submit_s < offset + horizon]
    clusters = sorted({j.cluster for j in trace})
    names = {c: f"team-{i:02d}" for i, c in enumerate(sorted(clusters, key=lambda c: (-_demand(window, c), c)))}
    projects = [names[c] for c in sorted(clusters, key=lambda c: names[c])]
    departments = {f"dept-{d}": tuple(projects[d::5]) for d in range(5)}
    synthetic = _synthetic(rng, departments, horizon, gpus)
    synthetic_load = sum(j.milli / 1000 * min(j.work, horizon - j.submit) for j in synthetic)
    budget = max(0.0, target_load * gpus * horizon - synthetic_load)
    training_load = sum(min(j.duration_s, horizon - j.submit_s) * j.num_gpus for j in window) or 1.0
    keep = min(1.0, budget / training_load)
    training = []
    for i, j in enumerate(window):
        if rng.random() >= keep or j.num_gpus > gpus:
            continue
        members = math.ceil(j.num_gpus / MEMBER_GPUS) if j.num_gpus > MEMBER_GPUS else 1
        per = MEMBER_GPUS if members > 1 else j.num_gpus
        training.append(
            OrgJob(
                f"philly-{i:06d}",
                names[j.cluster],
                "training",
                j.submit_s,
                max(1.0, j.duration_s),
                gpus=per,
                members=members,
            )
        )
    jobs = tuple(sorted(training + synthetic, key=lambda j: (j.submit, j.id)))
    jobs = utilisation(declare(jobs, seed), seed)
    demand: dict[str, float] = {}
    for job in jobs:
        demand[job.project] = demand.get(job.project, 0.0) + job.milli * min(job.work, horizon - job.submit)
    return Organisation(departments, _quotas(demand, projects, gpus), jobs)


MAX_DECLARED_S = 7 * DAY
"""The longest duration a user may declare."""
ROUND_DURATIONS = (600.0, 1_800.0, HOUR, 2 * HOUR, 4 * HOUR, 8 * HOUR, 12 * HOUR, DAY, 2 * DAY, 3 * DAY, MAX_DECLARED_S)
"""The values users declare: round ones (Tsafrir, JSSPP 2010: about 90% of jobs use some 20 values)."""
AT_MAXIMUM = 0.35
"""Share of users who declare the maximum allowed, the most popular single value."""
STEPS_UP = (0.5, 0.3, 0.2)
"""The others: the first round value above the runtime, or one or two further up."""


def declare(jobs: tuple[OrgJob, ...], seed: int) -> tuple[OrgJob, ...]:
    """Each job's declared maximum duration, drawn as users choose one: modal, a round value above what it
    needs (the work is stopped there) and often the maximum allowed. Never its runtime nor a multiple of it (a
    value that happens to be one is lowered by half the runtime), and from a generator of its own, so the rest of
    the organisation is the same with or without it."""
    rng = random.Random(f"declared-{seed}")
    out = []
    for job in jobs:
        declared = None
        if job.kind != "inference" and job.work < MAX_DECLARED_S:
            fitting = [v for v in ROUND_DURATIONS if v > job.work]
            if rng.random() < AT_MAXIMUM:
                declared = fitting[-1]
            else:
                up = rng.choices(range(len(STEPS_UP)), STEPS_UP)[0]
                declared = fitting[min(up, len(fitting) - 1)]
            if (declared / job.work).is_integer():  # a runtime of a few seconds divides every round value
                declared -= job.work / 2
        out.append(replace(job, declared=declared))
    return tuple(out)


def _demand(window: list[PhillyJob], cluster: str) -> float:
    return sum(j.duration_s * j.num_gpus for j in window if j.cluster == cluster)


def _quotas(demand: dict[str, float], projects: list[str], gpus: int) -> dict[str, int]:
    """Deserved GPUs in proportion to demand, every team at least one, summing to at most the cluster."""
    total = sum(demand.values()) or 1.0
    share = {p: max(1, math.floor(gpus * 0.95 * demand.get(p, 0.0) / total)) for p in projects}
    while sum(share.values()) > gpus:
        biggest = max(projects, key=lambda p: (share[p], p))
        share[biggest] -= 1
    return share


def _synthetic(rng: random.Random, departments: dict[str, tuple[str, ...]], horizon: float, gpus: int) -> list[OrgJob]:
    jobs: list[OrgJob] = []
    scale = gpus / 256
    for dept, projects in sorted(departments.items()):
        # Inference: one long-lived 1-GPU service per department (two in large clusters), ~60% busy.
        for k in range(max(1, round(2 * scale))):
            jobs.append(OrgJob(f"serve-{dept}-{k}", projects[0], "inference", 0.0, horizon, gpus=1, busy_fraction=0.6))
        for project in projects:
            jobs.extend(_notebooks(rng, project, horizon, scale))
            jobs.extend(_sweeps(rng, project, horizon, scale))
    return jobs


def _notebooks(rng: random.Random, project: str, horizon: float, scale: float) -> list[OrgJob]:
    """Working days, 9:00-18:00: about 2 x scale notebooks a day per project, 2-6 h sessions of 1/4 or 1/2
    GPU, active in 5-20 minute bursts that cover about 15% of the session."""
    out = []
    day = 0.0
    n = 0
    while day < horizon:
        if int(day // DAY) % 7 < 5:
            for _ in range(_poisson(rng, 2 * scale)):
                start = day + 9 * HOUR + rng.random() * 9 * HOUR
                length = rng.uniform(2, 6) * HOUR
                bursts = []
                t = start + rng.uniform(0, 20 * 60)
                while t < start + length:
                    dur = rng.uniform(5, 20) * 60
                    bursts.append(Burst(t, min(t + dur, start + length)))
                    t += dur / 0.15 * rng.uniform(0.5, 1.5)
                out.append(
                    OrgJob(
                        f"nb-{project}-{n:04d}",
                        project,
                        "notebook",
                        start,
                        length,
                        gpu_milli=rng.choice((250, 500)),
                        bursts=tuple(bursts),
                    )
                )
                n += 1
        day += DAY
    return [j for j in out if j.submit < horizon]


def _sweeps(rng: random.Random, project: str, horizon: float, scale: float) -> list[OrgJob]:
    """About one sweep every two days per project: 8-32 trials of one GPU, 10-60 minutes each."""
    out = []
    t = rng.expovariate(1 / (2 * DAY / scale))
    s = 0
    while t < horizon:
        for k in range(rng.randint(8, 32)):
            out.append(
                OrgJob(f"sweep-{project}-{s:03d}-{k:02d}", project, "batch", t, rng.uniform(10, 60) * 60, gpus=1)
            )
        s += 1
        t += rng.expovariate(1 / (2 * DAY / scale))
    return out


def _poisson(rng: random.Random, mean: float) -> int:
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1
