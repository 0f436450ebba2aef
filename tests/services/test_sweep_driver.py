"""The sweep driver against a store and a log it is handed line by line, so the order of what it sees is the test's:
a result read while the workload still looks running is the trial's value once it has succeeded, a trial is pruned
at the first step its pruner would prune it at, a trial whose result is read is never pruned, a trial that ends
without a value says why, and one asked before a crash cut its parameters short runs with all of them (the end to
end run: tests/e2e/test_sweeps.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from optuna.distributions import IntDistribution
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpupool.lifecycle.phases import Phase, StopReason
from gpupool.models.sweeps import SweepCreate
from gpupool.services.auth import Principal
from gpupool.services.sweep_driver import LOG_SETTLE_S, SweepDriver
from gpupool.services.sweeps import REASON, Studies
from gpupool.store.engine import make_engine, migrate, session_factory
from gpupool.store.tables import QueueRow, SweepRow, UserRow, WorkloadRow


class Logs:
    """The backend as the driver reads it: each workload's output, as far as it has been written."""

    def __init__(self) -> None:
        self.text: dict[int, bytes] = {}

    def read_log(self, workload_id: int, rank: int, offset: int, limit: int) -> bytes:
        return self.text.get(workload_id, b"")[offset : offset + limit]


class Sweep:
    def __init__(self, tmp_path: Path, **fields: Any) -> None:
        url = f"sqlite:///{tmp_path / 'db.sqlite'}"
        engine = make_engine(url)
        migrate(engine)
        self.sessions: sessionmaker[Session] = session_factory(engine)
        self.spec = SweepCreate.model_validate({
            "name": "search", "project": "vision", "command": ["train", "{x}"], "trials": 1,
            "space": {"x": {"type": "float", "low": 0, "high": 1}}, "pruner": {"kind": "none"},
            "sampler": {"kind": "random", "seed": 1},
        } | fields)  # fmt: skip
        self.studies = Studies(url)
        with self.sessions() as s:
            s.add(QueueRow(id=1, name="vision", kind="project", created_at=0, policy={}))
            s.add(UserRow(id=1, name="ana", role="admin", created_at=0))
            s.flush()
            s.add(SweepRow(id=1, name="search", project_id=1, owner_id=1, spec=self.spec.model_dump(mode="json"),
                           study="gpupool-sweep-1", state="running", created_at=0))  # fmt: skip
            s.commit()
        import optuna

        optuna.create_study(storage=self.studies.storage(), study_name="gpupool-sweep-1")
        self.logs = Logs()
        self.driver = SweepDriver(self.sessions, self.logs, self.studies, self._submit, interval_s=1.0)  # type: ignore[arg-type]
        self.now = 100.0
        self.commands: list[list[str]] = []

    def _submit(self, s: Session, who: Principal, body: Any, key: str) -> Any:
        self.commands.append(body.command)
        row = WorkloadRow(
            name=body.name, project_id=1, owner_id=1, type="training", priority_class="batch", priority=50,
            preemptible=True, grace_s=30, state=Phase.RUNNING, created_at=0, queued_at=0, allocations=[],
            idempotency_key=key,
        )  # fmt: skip
        s.add(row)
        s.flush()
        return SimpleNamespace(id=row.id)

    def step(self, later: float = 1.0) -> None:
        self.now += later
        self.driver.step(self.now)

    def write(self, workload: int, *lines: str) -> None:
        self.logs.text[workload] = self.logs.text.get(workload, b"") + "".join(f"{x}\n" for x in lines).encode()

    def succeed(self, workload: int) -> None:
        with self.sessions() as s:
            row = s.get(WorkloadRow, workload)
            assert row is not None
            row.state, row.finished_at = Phase.SUCCEEDED, self.now
            s.commit()

    def stopping(self) -> dict[int, str | None]:
        """Why each workload is being stopped (None: it is not)."""
        with self.sessions() as s:
            return {w.id: w.stop_reason for w in s.scalars(select(WorkloadRow))}

    def trials(self) -> list[tuple[str, float | None, int | None, str | None]]:
        """Each trial's state, value, last step and reason."""
        return [(t.state.name.lower(), t.value, max(t.intermediate_values, default=None), t.system_attrs.get(REASON))
                for t in self.studies.trials("gpupool-sweep-1")]  # fmt: skip


def test_a_result_read_while_the_workload_still_looks_running_is_its_value_once_it_succeeded(tmp_path: Path) -> None:
    sweep = Sweep(tmp_path)
    sweep.step()  # trial 0 is workload 1
    sweep.write(1, "gpupool.report step=0 value=5", "gpupool.result value=1.5")
    sweep.step()  # read before its exit is observed: the line is not read again
    sweep.succeed(1)
    sweep.step()
    assert sweep.trials() == [("complete", 1.5, 0, None)]


def test_a_trial_without_a_result_line_is_told_its_last_report_once_its_log_had_time_to_settle(
    tmp_path: Path,
) -> None:
    sweep = Sweep(tmp_path)
    sweep.step()
    sweep.write(1, "gpupool.report step=0 value=5", "gpupool.report step=1 value=4")
    sweep.succeed(1)
    sweep.step(LOG_SETTLE_S / 2)
    assert sweep.trials() == [("running", None, 1, None)]
    sweep.step(LOG_SETTLE_S)
    reason = "no result line on its output: its value is its last report (step 1)"
    assert sweep.trials() == [("complete", 4.0, 1, reason)]


def test_a_trial_that_succeeded_without_a_report_or_result_fails_saying_so(tmp_path: Path) -> None:
    sweep = Sweep(tmp_path)
    sweep.step()
    sweep.write(1, "hello")
    sweep.succeed(1)
    sweep.step(LOG_SETTLE_S + 1)
    reason = "its workload search-t0000 succeeded with no result or report line on its output"
    assert sweep.trials() == [("fail", None, None, reason)]


def test_a_trial_is_pruned_at_the_first_step_its_pruner_prunes_and_never_once_its_result_is_read(
    tmp_path: Path,
) -> None:
    pruner = {"kind": "median", "n_startup_trials": 1, "n_warmup_steps": 1}
    sweep = Sweep(tmp_path, trials=3, parallelism=3, pruner=pruner)
    sweep.step()  # trials 0, 1 and 2 are workloads 1, 2 and 3
    sweep.write(1, *(f"gpupool.report step={i} value=1" for i in range(4)), "gpupool.result value=1")
    sweep.succeed(1)
    # Both bad, read in one chunk by a driver that lagged: the one still running is pruned at step 1, as in-process;
    # the one that printed its result finished (its exit not yet observed) and is not.
    sweep.write(2, *(f"gpupool.report step={i} value=9" for i in range(4)))
    sweep.write(3, *(f"gpupool.report step={i} value=9" for i in range(4)), "gpupool.result value=9")
    sweep.step()
    sweep.succeed(3)
    sweep.step()
    assert sweep.trials() == [
        ("complete", 1.0, 3, None),
        ("pruned", 9.0, 1, "pruned at step 1; its workload was stopped"),
        ("complete", 9.0, 3, None),
    ]
    assert sweep.stopping() == {1: None, 2: StopReason.CANCEL, 3: None}  # the pruned one's GPU is freed


def test_a_trial_asked_before_a_crash_drew_its_parameters_is_submitted_with_them_drawn(tmp_path: Path) -> None:
    space = {"x": {"type": "float", "low": 0, "high": 1}, "n": {"type": "int", "low": 1, "high": 9}}
    sweep = Sweep(tmp_path, space=space, command=["train", "{x}", "{n}"])
    storage = sweep.studies.storage()
    trial_id = storage.create_new_trial(storage.get_study_id_from_name("gpupool-sweep-1"))  # the server stopped here
    storage.set_trial_param(trial_id, "n", 3, IntDistribution(1, 9))  # or here, with one of the two drawn
    sweep.step()
    [(_, x, n)] = sweep.commands
    assert 0 <= float(x) <= 1 and n == "3"
    assert storage.get_trial(trial_id).params == {"x": float(x), "n": 3}
