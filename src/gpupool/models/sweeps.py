"""Hyperparameter sweeps on the wire: a search space, an objective command, a metric and its direction, how many
trials and how many at once, a sampler and a pruner (Optuna's), and what each trial runs with."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from gpupool.models.wire import Name, Reply, Wire

PARAM_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"


class SweepState(StrEnum):
    RUNNING = "running"
    """Asking for trials until it has as many as it wants, then waiting for the last to end."""
    SUCCEEDED = "succeeded"
    """Every trial ended (some may have failed or been pruned)."""
    CANCELLED = "cancelled"


class Param(Wire):
    """One dimension of the search space, as Optuna's distributions take it."""

    type: Literal["float", "int", "categorical"]
    low: float | None = Field(None, allow_inf_nan=False)
    high: float | None = Field(None, allow_inf_nan=False)
    log: bool = False
    step: float | None = Field(None, gt=0, allow_inf_nan=False)
    choices: list[str | int | float | bool] | None = Field(None, min_length=1, max_length=1000)

    @model_validator(mode="after")
    def _shape(self) -> Param:
        if self.type == "categorical":
            if not self.choices or self.low is not None or self.high is not None:
                raise ValueError("a categorical parameter takes choices, and no low or high")
            return self
        if self.low is None or self.high is None or self.choices is not None:
            raise ValueError(f"a {self.type} parameter takes low and high, and no choices")
        if self.low > self.high:
            raise ValueError("low is above high")
        if self.log and (self.low <= 0 or self.step is not None):
            raise ValueError("a log-scaled parameter needs low > 0 and no step")
        if self.type == "int" and (self.low != int(self.low) or self.high != int(self.high)):
            raise ValueError("an int parameter's low and high are whole numbers")
        return self


class Sampler(Wire):
    kind: Literal["tpe", "random", "qmc"] = "tpe"
    seed: int | None = Field(None, ge=0, le=2**32 - 1)


class Pruner(Wire):
    kind: Literal["none", "median", "percentile", "hyperband"] = "median"
    n_startup_trials: int = Field(5, ge=0, le=10_000, description="Trials that finish before any is pruned.")
    n_warmup_steps: int = Field(0, ge=0, le=1_000_000, description="Steps of a trial before it may be pruned.")
    percentile: float = Field(50.0, gt=0, lt=100, allow_inf_nan=False)


class SweepCreate(Wire):
    name: Name
    project: Name
    command: list[str] = Field(min_length=1, max_length=1024)
    """The objective: each `{param}` in it becomes the trial's value; every parameter is also in the environment as
    SWEEP_PARAM_<NAME> (with SWEEP_NAME and SWEEP_TRIAL). The trial reports with lines on its output:
    `gpupool.report step=N value=V` for an intermediate value, `gpupool.result value=V` for its result (else its
    last report is)."""
    space: dict[str, Param] = Field(min_length=1, max_length=64)
    metric: str = Field("value", min_length=1, max_length=63, pattern=PARAM_NAME)
    direction: Literal["minimize", "maximize"] = "minimize"
    trials: int = Field(ge=1, le=10_000)
    parallelism: int = Field(1, ge=1, le=256)
    sampler: Sampler = Field(default_factory=Sampler)
    pruner: Pruner = Field(default_factory=Pruner)
    gpu: float | None = Field(None, gt=0, lt=1, allow_inf_nan=False, description="A fraction of one GPU per trial.")
    gpus: int | None = Field(None, ge=0, le=64)
    priority: str = Field("batch", max_length=63)
    image: str | None = Field(None, max_length=512, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$")
    code: str | None = Field(None, pattern=r"^sha256:[0-9a-f]{64}$")
    env: dict[str, str] = Field(default_factory=dict, max_length=256)

    @model_validator(mode="after")
    def _names(self) -> SweepCreate:
        import re

        bad = sorted(n for n in self.space if not re.match(PARAM_NAME, n))
        if bad:
            raise ValueError(f"parameter names are letters, digits and _: {', '.join(bad)[:200]}")
        return self


class TrialPublic(Reply):
    number: int
    state: str
    """Optuna's: running, complete, pruned, fail, waiting."""
    params: dict[str, str | int | float | bool]
    value: float | None = None
    last_step: int | None = None
    workload: str | None = None
    """The name of the workload that runs it, in the sweep's project."""
    reason: str | None = None
    """Why it ended as it did, where gpupool decided: why it failed (its workload failed or was refused, or printed
    neither result nor report), the step it was pruned at, or that its value is its last report."""


class SweepPublic(Reply):
    name: str
    project: str
    state: SweepState
    metric: str
    direction: Literal["minimize", "maximize"]
    trials: int
    parallelism: int
    counts: dict[str, int] = Field(default_factory=dict)
    """Trials by Optuna state."""
    best: TrialPublic | None = None
    created_at: float


class SweepDetail(SweepPublic):
    spec: SweepCreate
    trial_list: list[TrialPublic] = Field(default_factory=list)
