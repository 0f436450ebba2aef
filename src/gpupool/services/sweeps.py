"""Hyperparameter sweeps: Optuna studies whose trials run as gpupool workloads. This module keeps the sweeps (create,
list, describe, cancel); `sweep_driver` runs them.

The study lives in Optuna's own RDB storage beside gpupool's tables: in the same PostgreSQL database, in a schema
of its own (`optuna`), or, with SQLite, in a file beside gpupool's (`<name>-optuna.db`). Optuna keeps its own
Alembic version and a table named `trials`: sharing gpupool's namespace, the two schemas' migrations would
collide."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from gpupool.core.priority import DEFAULT_CLASSES
from gpupool.models.sweeps import SweepCreate, SweepDetail, SweepPublic, SweepState, TrialPublic
from gpupool.services import audit
from gpupool.services.auth import Principal
from gpupool.services.errors import Conflict, Invalid, NotFound
from gpupool.store.tables import QueueRow, SweepRow, WorkloadRow

SCHEMA = "optuna"
REASON = "gpupool:reason"
"""The system attribute of an Optuna trial that says why gpupool ended it as it did (failed, pruned, or valued by
its last report)."""


class Studies:
    """Optuna's storage for every sweep, opened on first use (`gpupool[sweeps]` brings Optuna)."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self._storage: Any = None
        self._lock = threading.Lock()

    def storage(self) -> Any:
        with self._lock:
            if self._storage is None:
                self._storage = self._open()
            return self._storage

    def _open(self) -> Any:
        try:
            import optuna
        except ImportError as e:  # pragma: no cover - depends on what is installed
            raise Invalid("sweeps need Optuna on the server: pip install 'gpupool[sweeps]'") from e
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        url = make_url(self.database_url)
        if url.get_backend_name() == "sqlite":
            path = Path(url.database or "")
            beside = url.set(database=str(path.with_name(f"{path.stem}-optuna{path.suffix or '.db'}")))
            return optuna.storages.RDBStorage(beside.render_as_string(hide_password=False))
        from sqlalchemy import create_engine

        engine = create_engine(url)
        with engine.begin() as c:
            c.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
        engine.dispose()
        return optuna.storages.RDBStorage(
            self.database_url, engine_kwargs={"connect_args": {"options": f"-csearch_path={SCHEMA}"}}
        )

    def trials(self, study: str) -> list[Any]:
        storage = self.storage()
        return list(storage.get_all_trials(storage.get_study_id_from_name(study), deepcopy=False))

    def load(self, study: str, spec: SweepCreate, asked: int = 0) -> Any:
        """The study with the sweep's sampler and pruner. A seeded sampler is seeded with the seed plus the trials
        already asked, so a server that restarts does not draw the same parameters again."""
        import optuna

        s, p = spec.sampler, spec.pruner
        seed = None if s.seed is None else s.seed + asked
        samplers = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler,
                    "qmc": optuna.samplers.QMCSampler}  # fmt: skip
        sampler = samplers[s.kind](seed=seed)
        pruners: dict[str, Any] = {
            "none": optuna.pruners.NopPruner,
            "median": lambda: optuna.pruners.MedianPruner(p.n_startup_trials, p.n_warmup_steps),
            "percentile": lambda: optuna.pruners.PercentilePruner(p.percentile, p.n_startup_trials, p.n_warmup_steps),
            "hyperband": optuna.pruners.HyperbandPruner,
        }
        return optuna.load_study(study_name=study, storage=self.storage(), sampler=sampler, pruner=pruners[p.kind]())


def _project(session: Session, who: Principal, name: str, write: bool) -> QueueRow:
    row = session.scalar(select(QueueRow).where(QueueRow.name == name, QueueRow.kind == "project"))
    if row is None or not who.can_read(row.id):
        raise NotFound(f"no project named {name!r}")
    if write and not who.can_write(row.id):
        from gpupool.services.errors import Forbidden

        raise Forbidden(f"your role ({who.role}) cannot run sweeps in {name!r}")
    return row


def _row(session: Session, who: Principal, project: str, name: str) -> tuple[SweepRow, QueueRow]:
    p = _project(session, who, project, write=False)
    row = session.scalar(select(SweepRow).where(SweepRow.project_id == p.id, SweepRow.name == name))
    if row is None:
        raise NotFound(f"no sweep named {name!r} in {project!r}")
    return row, p


def create(session: Session, who: Principal, body: SweepCreate, studies: Studies, now: float) -> SweepPublic:
    audit.note(tenant=body.project, obj=f"sweep/{body.name}")
    project = _project(session, who, body.project, write=True)
    if body.priority not in {c.name for c in DEFAULT_CLASSES}:
        raise Invalid(f"unknown priority class {body.priority!r}: {', '.join(c.name for c in DEFAULT_CLASSES)}")
    if session.scalar(select(SweepRow).where(SweepRow.project_id == project.id, SweepRow.name == body.name)):
        raise Conflict(f"a sweep named {body.name!r} already exists in {body.project!r}")
    distributions(body)  # Optuna's own check of the space, before anything is written
    row = SweepRow(
        name=body.name, project_id=project.id, owner_id=who.id, spec=body.model_dump(mode="json"), study="",
        state=SweepState.RUNNING.value, created_at=now,
    )  # fmt: skip
    session.add(row)
    session.flush()
    row.study = f"gpupool-sweep-{row.id}"
    import optuna

    optuna.create_study(storage=studies.storage(), study_name=row.study, direction=body.direction, load_if_exists=True)
    session.commit()
    return _public(row, project.name, None)


def list_sweeps(session: Session, who: Principal, studies: Studies) -> list[SweepPublic]:
    projects = {q.id: q.name for q in session.scalars(select(QueueRow))}
    out = []
    for row in session.scalars(select(SweepRow).order_by(SweepRow.id)):
        if who.can_read(row.project_id):
            out.append(_public(row, projects[row.project_id], _trials(studies, row)))
    return out


def describe(session: Session, who: Principal, project: str, name: str, studies: Studies) -> SweepDetail:
    row, p = _row(session, who, project, name)
    trials = _trials(studies, row)
    names = trial_workloads(session, row)
    listed = [_trial(t, names.get(t.number)) for t in trials]
    public = _public(row, p.name, trials)
    return SweepDetail(**public.model_dump(), spec=SweepCreate.model_validate(row.spec), trial_list=listed)


def cancel(session: Session, who: Principal, project: str, name: str, studies: Studies) -> SweepPublic:
    audit.note(tenant=project, obj=f"sweep/{name}")
    row, p = _row(session, who, project, name)
    if not who.can_write(p.id):
        from gpupool.services.errors import Forbidden

        raise Forbidden(f"your role ({who.role}) cannot cancel sweeps in {project!r}")
    if row.state == SweepState.RUNNING:
        row.state = SweepState.CANCELLED.value  # the driver stops its running trials at its next step
        session.commit()
    return _public(row, p.name, _trials(studies, row))


def trial_key(sweep_id: int, number: int) -> str:
    """The idempotency key a trial's workload is submitted with: one workload per trial, whatever crashes."""
    return f"sweep:{sweep_id}:{number}"


def trial_workloads(session: Session, row: SweepRow) -> dict[int, str]:
    """Each trial's workload name, by trial number."""
    prefix = f"sweep:{row.id}:"
    query = select(WorkloadRow.idempotency_key, WorkloadRow.name).where(
        WorkloadRow.owner_id == row.owner_id, WorkloadRow.idempotency_key.like(f"{prefix}%")
    )
    return {int(str(key)[len(prefix) :]): name for key, name in session.execute(query)}


def distributions(spec: SweepCreate) -> dict[str, Any]:
    """The space as Optuna's distributions (which check it)."""
    from optuna import distributions as d

    out: dict[str, Any] = {}
    try:
        for name, p in spec.space.items():
            if p.type == "categorical":
                out[name] = d.CategoricalDistribution(list(p.choices or []))
            elif p.type == "int":
                out[name] = d.IntDistribution(int(p.low or 0), int(p.high or 0), log=p.log, step=int(p.step or 1))
            else:
                out[name] = d.FloatDistribution(float(p.low or 0), float(p.high or 0), log=p.log, step=p.step)
    except ValueError as e:
        raise Invalid(f"space: {e}") from e
    return out


def _trials(studies: Studies, row: SweepRow) -> list[Any]:
    return studies.trials(row.study)


def _trial(t: Any, workload: str | None) -> TrialPublic:
    steps = t.intermediate_values
    return TrialPublic(
        number=t.number, state=t.state.name.lower(), params=dict(t.params), value=t.value,
        last_step=max(steps) if steps else None, workload=workload, reason=t.system_attrs.get(REASON),
    )  # fmt: skip


def _public(row: SweepRow, project: str, trials: list[Any] | None) -> SweepPublic:
    spec = SweepCreate.model_validate(row.spec)
    counts: dict[str, int] = {}
    done = []
    for t in trials or []:
        state = t.state.name.lower()
        counts[state] = counts.get(state, 0) + 1
        if state == "complete" and t.value is not None:
            done.append(t)
    sign = 1 if spec.direction == "minimize" else -1
    best = min(done, key=lambda t: (sign * t.value, t.number), default=None)
    return SweepPublic(
        name=row.name, project=project, state=SweepState(row.state), metric=spec.metric, direction=spec.direction,
        trials=spec.trials, parallelism=spec.parallelism, counts=dict(sorted(counts.items())),
        best=None if best is None else _trial(best, None), created_at=row.created_at,
    )  # fmt: skip


def plot(session: Session, who: Principal, project: str, name: str, studies: Studies) -> bytes:
    """The sweep's optimisation history as a PNG: Optuna's own plot (each completed trial's value, and the best so
    far), drawn with matplotlib."""
    row, _ = _row(session, who, project, name)
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on a server
        import io

        import matplotlib.pyplot as plt
        from optuna.visualization.matplotlib import plot_optimization_history
    except ImportError as e:  # pragma: no cover - depends on what is installed
        raise Invalid("plots need matplotlib on the server: pip install 'gpupool[sweeps]'") from e
    spec = SweepCreate.model_validate(row.spec)
    with _PLOT_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
        ax = plot_optimization_history(studies.load(row.study, spec), target_name=spec.metric)
        ax.set_title(f"{project}/{name}")
        out = io.BytesIO()
        plt.savefig(out, format="png", dpi=100, bbox_inches="tight")  # the plot's figure is pyplot's current one
        plt.close("all")
    return out.getvalue()


_PLOT_LOCK = threading.Lock()
"""pyplot keeps global state: one figure at a time."""
