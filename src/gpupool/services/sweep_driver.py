"""Running sweeps: the leader, after its scheduling cycles, asks each running sweep's Optuna study for trials and
submits each as a workload of the sweep's owner; reads what running trials report on their output and passes it to
the study, stopping at once a trial its pruner prunes; and tells the study how each trial ended.

Exactly once: a trial is asked of the study (a row in Optuna's storage, state running) before its workload is
submitted with the idempotency key `sweep:<id>:<number>`, so a crash between the two leaves a running trial with
no workload, which the next step submits (drawing the parameters a crash inside the ask left undrawn), and a crash
after leaves one the key finds again. A trial whose
workload is preempted stays running and runs again when the workload is requeued (gpupool keeps its place)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
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
from gpupool.services.sweeps import REASON, Studies, distributions, trial_key
from gpupool.store.tables import QueueRow, SweepRow, UserRow, WorkloadRow

log = logging.getLogger("gpupool.sweeps")

Submit = Callable[[Session, Principal, WorkloadCreate, str], WorkloadPublic]
"""services.workloads.submit with the server's settings, and an idempotency key."""

REPORT = re.compile(rb"^gpupool\.report step=(\d+) value=(\S+)\s*$")
RESULT = re.compile(rb"^gpupool\.result value=(\S+)\s*$")
READ_LIMIT = 1 << 20
LOG_SETTLE_S = 3.0
"""How long after a trial's workload succeeded a log without a result line is read again before the trial is told
its last report: a backend may serve a log late or not at all for a moment (Kubernetes' answers b"" on an error)."""


@dataclass
class TrialOutput:
    """What the driver has read of one trial's output (from the start again after a restart: Optuna keeps the first
    report of a step)."""

    offset: int = 0
    """How far it has been read, to its last whole line."""
    ended: bool = False
    """Its result line has been read: the trial finished, and nothing it reported is pruned any more."""
    result: float | None = None
    """That line's value (None where it is no number: the last report stands for it). Kept until the trial is told:
    the line is read once, and may be read while the workload still looks live (its exit not yet observed)."""


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
        self._outputs: dict[int, TrialOutput] = {}
        """Each running trial's output, by workload id."""

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
        space = distributions(spec)
        settling = 0
        for t in trials:
            if t.state is not TrialState.RUNNING:
                continue
            w = mine.get(trial_key(row.id, t.number))
            if w is None:
                if cancelled:
                    self._tell(study, t, TrialState.FAIL, "the sweep was cancelled before its workload was submitted")
                    continue
                made = self._submit(s, who, spec, project.name, row, t.number, _drawn(study, t, space))
                if isinstance(made, str):
                    self._tell(study, t, TrialState.FAIL, made)
                    continue
                w = mine[trial_key(row.id, t.number)] = made
            phase = Phase(w.state)
            out = self._outputs.setdefault(w.id, TrialOutput())
            trial = optuna.trial.Trial(study, t._trial_id)
            pruned_at = self._read(w, out, trial, prune=phase in LIVE and not cancelled)
            if pruned_at is not None:
                workloads.cancel(s, who, str(w.id), project.name)
                self._tell(study, t, TrialState.PRUNED, f"pruned at step {pruned_at}; its workload was stopped")
                self._outputs.pop(w.id, None)
                log.info("sweep %s: trial %d pruned at step %d; workload %d stopped", row.name, t.number, pruned_at,
                         w.id)  # fmt: skip
            elif cancelled and phase not in (Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED):
                workloads.cancel(s, who, str(w.id), project.name)
                self._tell(study, t, TrialState.FAIL, "the sweep was cancelled; its workload was stopped")
                self._outputs.pop(w.id, None)
            elif phase == Phase.SUCCEEDED and not out.ended and now - (w.finished_at or now) < LOG_SETTLE_S:
                settling += 1  # its log may not be whole yet where the backend serves it late: read next step
            elif phase == Phase.SUCCEEDED:
                self._succeeded(study, t, out, w)
            elif phase in (Phase.FAILED, Phase.CANCELLED):
                code = "" if w.exit_code is None else f" (exit code {w.exit_code})"
                self._tell(study, t, TrialState.FAIL, f"its workload {w.name} {phase.value}{code}")
                self._outputs.pop(w.id, None)
        # A trial holds its place until its workload has ended: a pruned one's, stopping with its grace period,
        # still holds its GPU, and the sweep never runs more than its parallelism at once.
        running = settling + sum(1 for w in mine.values() if Phase(w.state) not in TERMINAL)
        asked = len(trials)
        while not cancelled and running < spec.parallelism and asked < spec.trials:
            t = study.ask(space)
            asked += 1
            made = self._submit(s, who, spec, project.name, row, t.number, t.params)
            if isinstance(made, str):
                self._tell(study, t, TrialState.FAIL, made)
            else:
                mine[trial_key(row.id, t.number)] = made
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
    ) -> WorkloadRow | str:  # fmt: skip
        """The trial's workload; where it is refused, why (the trial fails: what it asks cannot run)."""
        try:
            body = trial_spec(spec, project, row.name, number, params)
            public = self.submit(s, who, body, trial_key(row.id, number))
        except (ServiceError, ValidationError) as e:
            s.rollback()
            log.warning("sweep %s: trial %d cannot be submitted: %s", row.name, number, e)
            return f"its workload was refused: {e}"[:1000]
        found = s.get(WorkloadRow, public.id)
        assert found is not None
        log.info("sweep %s: trial %d is workload %d %s", row.name, number, public.id, params)
        return found

    def _succeeded(self, study: Any, t: Any, out: TrialOutput, w: WorkloadRow) -> None:
        """Tell the study the value of a trial whose workload succeeded: its result, else its last report."""
        from optuna.trial import TrialState

        self._outputs.pop(w.id, None)
        if out.result is not None:
            study.tell(t.number, out.result)
            return
        steps = self.studies.storage().get_trial(t._trial_id).intermediate_values
        if not steps:
            what = "a result line it could not read as a number" if out.ended else "no result or report line"
            self._tell(study, t, TrialState.FAIL, f"its workload {w.name} succeeded with {what} on its output")
            return
        last = max(steps)
        self._note(t, f"no result line on its output: its value is its last report (step {last})")
        study.tell(t.number, float(steps[last]))

    def _tell(self, study: Any, t: Any, state: Any, reason: str) -> None:
        """End a trial that has no value (failed or pruned), saying why."""
        self._note(t, reason)
        study.tell(t.number, state=state)

    def _note(self, t: Any, reason: str) -> None:
        self.studies.storage().set_trial_system_attr(t._trial_id, REASON, reason)

    def _read(self, w: WorkloadRow, out: TrialOutput, trial: Any, prune: bool) -> int | None:
        """Pass the trial's new reports to the study, and keep its result where it printed one. Where `prune`, the
        pruner is asked after each new report, as the objective would ask it in-process: the step it prunes at is
        returned (its later reports, read in the same chunk by a driver that lagged, are not told). A trial whose
        result line is read is never pruned: it finished, whatever the workload's state says yet."""
        try:
            data = self.backend.read_log(w.id, 0, out.offset, READ_LIMIT)
        except Exception:  # no log yet (not launched), or its node unreachable: read next step
            return None
        complete = data[: data.rfind(b"\n") + 1]
        out.offset += len(complete)
        reports: list[tuple[int, float]] = []
        for line in complete.splitlines():
            if m := REPORT.match(line):
                value = _number(m.group(2))
                if value is not None:
                    reports.append((int(m.group(1)), value))
            elif m := RESULT.match(line):
                out.ended, out.result = True, _number(m.group(1))
        seen = set(self.studies.storage().get_trial(trial._trial_id).intermediate_values) if reports else set()
        for step, value in reports:
            if step in seen:  # a step read again after a restart: reported once
                continue
            trial.report(value, step)
            seen.add(step)
            if prune and not out.ended and trial.should_prune():
                return step
        return None


def _drawn(study: Any, t: Any, space: dict[str, Any]) -> dict[str, Any]:
    """A trial's parameters, every one: a server stopped between asking for a trial and drawing each of its
    parameters (each a write of its own) left it running with some or none, and they are drawn now, as the ask
    would have (else its command would run with `{x}` where the value goes)."""
    if set(t.params) >= set(space):
        return dict(t.params)
    import optuna

    trial = optuna.trial.Trial(study, t._trial_id)
    return {name: trial._suggest(name, d) for name, d in space.items()}  # what was drawn is kept as it is


def _number(raw: bytes) -> float | None:
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None
