"""Running sweeps: the leader, after its scheduling cycles, asks each running sweep's Optuna study for trials and
submits each as a workload of the sweep's owner; reads what running trials report on their output and passes it to
the study, stopping at once a trial its pruner prunes; and tells the study how each trial ended.

Exactly once: a trial is asked of the study (a row in Optuna's storage, state running) before its workload is
submitted with the idempotency key `sweep:<id>:<number>`, so a crash between the two leaves a running trial with
no workload, which the next step submits, and a crash after leaves one the key finds again. A trial whose
workload is preempted stays running and runs again when the workload is requeued (gpupool keeps its place)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpupool.backends.base import Backend
from gpupool.lifecycle.phases import LIVE, TERMINAL, Phase
from gpupool.models.schemas import WorkloadCreate, WorkloadPublic
from gpupool.models.sweeps import SweepCreate, SweepState
from gpupool.services import workloads
from gpupool.services.auth import Principal, principal_for
from gpupool.services.errors import ServiceError
from gpupool.services.sweeps import Studies, distributions, trial_key
from gpupool.store.tables import QueueRow, SweepRow, UserRow, WorkloadRow

log = logging.getLogger("gpupool.sweeps")

Submit = Callable[[Session, Principal, WorkloadCreate, str], WorkloadPublic]
"""services.workloads.submit with the server's settings, and an idempotency key."""

REPORT = re.compile(rb"^gpupool\.report step=(\d+) value=(\S+)\s*$")
RESULT = re.compile(rb"^gpupool\.result value=(\S+)\s*$")
READ_LIMIT = 1 << 20
LOG_SETTLE_S = 3.0
"""How long after a trial's workload succeeded its log may still be taking its last lines: until then a trial that
printed no result yet is read again rather than told its last report (a loaded host was seen to lag)."""


def trial_name(sweep: str, number: int) -> str:
    return f"{sweep[:48]}-t{number:04d}"


def trial_spec(spec: SweepCreate, project: str, sweep: str, number: int, params: dict[str, Any]) -> WorkloadCreate:
    """The trial's workload: the objective command with `{param}` replaced by each value, the parameters in the
    environment too, and the sweep's resources and priority."""
    command = list(spec.command)
    for name, value in params.items():
        command = [arg.replace(f"{{{name}}}", str(value)) for arg in command]
    env = dict(spec.env) | {f"SWEEP_PARAM_{n.upper()}": str(v) for n, v in params.items()}
    env |= {"SWEEP_NAME": sweep, "SWEEP_TRIAL": str(number)}
    return WorkloadCreate(
        project=project, name=trial_name(sweep, number), type="training", gpu=spec.gpu, gpus=spec.gpus,
        priority=spec.priority, command=command, image=spec.image, code=spec.code, env=env,
    )  # fmt: skip


class SweepDriver:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        backend: Backend,
        studies: Studies,
        submit: Submit,
        interval_s: float = 1.0,
    ) -> None:
        self.interval_s = interval_s
        self._next = 0.0
        self.sessions = sessions
        self.backend = backend
        self.studies = studies
        self.submit = submit
        self._loaded: dict[int, Any] = {}
        self._offsets: dict[int, int] = {}
        """How far each running trial's output has been read (from the start again after a restart: Optuna keeps
        the first report of a step)."""

    def step(self, now: float) -> None:
        if now < self._next:
            return
        self._next = now + self.interval_s
        with self.sessions() as s:
            rows = list(s.scalars(select(SweepRow).where(SweepRow.finished_at.is_(None)).order_by(SweepRow.id)))
            for row in rows:
                try:
                    self._sweep(s, row, now)
                except Exception:  # one sweep's fault must not stop the others; tried again next step
                    log.exception("sweep %s", row.name)
                    s.rollback()

    def _sweep(self, s: Session, row: SweepRow, now: float) -> None:
        import optuna
        from optuna.trial import TrialState

        spec = SweepCreate.model_validate(row.spec)
        study = self._loaded.get(row.id)
        if study is None:  # kept between steps: its sampler learns from what it drew
            study = self._loaded[row.id] = self.studies.load(row.study, spec, len(self.studies.trials(row.study)))
        owner = s.get(UserRow, row.owner_id)
        project = s.get(QueueRow, row.project_id)
        if owner is None or project is None:
            return
        who = principal_for(s, owner)
        trials = study.get_trials(deepcopy=False)
        mine = {
            str(w.idempotency_key): w
            for w in s.scalars(select(WorkloadRow).where(
                WorkloadRow.owner_id == row.owner_id, WorkloadRow.idempotency_key.like(f"sweep:{row.id}:%")
            ))
        }  # fmt: skip
        cancelled = row.state == SweepState.CANCELLED
        settling = 0
        for t in trials:
            if t.state is not TrialState.RUNNING:
                continue
            w = mine.get(trial_key(row.id, t.number))
            if w is None:
                if cancelled:
                    study.tell(t.number, state=TrialState.FAIL)
                    continue
                w = self._submit(s, who, spec, project.name, row, t.number, t.params)
                if w is None:
                    study.tell(t.number, state=TrialState.FAIL)
                    continue
                mine[trial_key(row.id, t.number)] = w
            phase = Phase(w.state)
            final = self._read(w, optuna.trial.Trial(study, t._trial_id), prune=phase in LIVE and not cancelled)
            if final == "pruned":
                workloads.cancel(s, who, str(w.id), project.name)
                study.tell(t.number, state=TrialState.PRUNED)
                log.info("sweep %s: trial %d pruned; workload %d stopped", row.name, t.number, w.id)
            elif cancelled and phase not in (Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED):
                workloads.cancel(s, who, str(w.id), project.name)
                study.tell(t.number, state=TrialState.FAIL)
            elif phase == Phase.SUCCEEDED and final is None and now - (w.finished_at or now) < LOG_SETTLE_S:
                settling += 1  # its last lines (the result) may still be on their way into its log: read next step
            elif phase == Phase.SUCCEEDED:
                value = final if isinstance(final, float) else _last(self.studies.storage().get_trial(t._trial_id))
                if value is None:
                    study.tell(t.number, state=TrialState.FAIL)
                else:
                    study.tell(t.number, value)
                self._offsets.pop(w.id, None)
            elif phase in (Phase.FAILED, Phase.CANCELLED):
                study.tell(t.number, state=TrialState.FAIL)
                self._offsets.pop(w.id, None)
        # A trial holds its place until its workload has ended: a pruned one's, stopping with its grace period,
        # still holds its GPU, and the sweep never runs more than its parallelism at once.
        running = settling + sum(1 for w in mine.values() if Phase(w.state) not in TERMINAL)
        asked = len(trials)
        space = distributions(spec)
        while not cancelled and running < spec.parallelism and asked < spec.trials:
            t = study.ask(space)
            asked += 1
            w = self._submit(s, who, spec, project.name, row, t.number, t.params)
            if w is None:
                study.tell(t.number, state=TrialState.FAIL)
            else:
                mine[trial_key(row.id, t.number)] = w
                running += 1
        if running == 0 and (cancelled or asked >= spec.trials) and row.finished_at is None:
            if not cancelled:
                row.state = SweepState.SUCCEEDED.value
            row.finished_at = now
            self._loaded.pop(row.id, None)
            log.info("sweep %s: %s", row.name, row.state)
        s.commit()

    def _submit(
        self, s: Session, who: Principal, spec: SweepCreate, project: str, row: SweepRow, number: int,
        params: dict[str, Any],
    ) -> WorkloadRow | None:  # fmt: skip
        """The trial's workload; None where it is refused (the trial fails: what it asks cannot run)."""
        try:
            body = trial_spec(spec, project, row.name, number, params)
            public = self.submit(s, who, body, trial_key(row.id, number))
        except (ServiceError, ValidationError) as e:
            s.rollback()
            log.warning("sweep %s: trial %d cannot be submitted: %s", row.name, number, e)
            return None
        found = s.get(WorkloadRow, public.id)
        assert found is not None
        log.info("sweep %s: trial %d is workload %d %s", row.name, number, public.id, params)
        return found

    def _read(self, w: WorkloadRow, trial: Any, prune: bool) -> float | str | None:
        """Pass the trial's new reports to the study; "pruned" where its pruner says so (and `prune`), else its
        result where it printed one."""
        offset = self._offsets.get(w.id, 0)
        try:
            data = self.backend.read_log(w.id, 0, offset, READ_LIMIT)
        except Exception:  # no log yet (not launched), or its node unreachable: read next step
            return None
        complete = data[: data.rfind(b"\n") + 1]
        self._offsets[w.id] = offset + len(complete)
        result: float | str | None = None
        reported = False
        seen = set(self.studies.storage().get_trial(trial._trial_id).intermediate_values)
        for line in complete.splitlines():
            if m := REPORT.match(line):
                value, step = _number(m.group(2)), int(m.group(1))
                if value is not None and step not in seen:  # a step read again after a restart: reported once
                    trial.report(value, step)
                    seen.add(step)
                    reported = True
            elif m := RESULT.match(line):
                result = _number(m.group(1))
        if prune and reported and trial.should_prune():
            return "pruned"
        return result


def _number(raw: bytes) -> float | None:
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


def _last(t: Any) -> float | None:
    steps = t.intermediate_values
    return float(steps[max(steps)]) if steps else None
