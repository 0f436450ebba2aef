"""Wire models of retries, attempts, a name's history and declarative apply. Like schemas.py they depend on
pydantic (and the standard-library lifecycle enums) only; schemas.py imports RetryPolicy from here."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

from gpupool.lifecycle.phases import MAX_RETRIES, RETRY_BACKOFF_CAP_S, AttemptOutcome, RetryOn


class RetryPolicy(BaseModel):
    """When a workload is started again, how often and after how long. YAML may say `retry: on-failure` alone,
    or spell the fields with dashes (`max-retries`) as the CLI's flags do, and `backoff` for `backoff_s`."""

    model_config = ConfigDict(extra="forbid")

    on: RetryOn = RetryOn.ON_FAILURE
    max_retries: int = Field(3, ge=0, le=MAX_RETRIES)
    backoff_s: float = Field(
        10.0, ge=0, le=RETRY_BACKOFF_CAP_S, allow_inf_nan=False,
        description="The wait before the first retry; it doubles with each retry, up to 15 minutes.",
    )  # fmt: skip

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"on": value}
        if isinstance(value, dict):
            names = {"max-retries": "max_retries", "backoff": "backoff_s", "backoff-s": "backoff_s"}
            return {names.get(k, k) if isinstance(k, str) else k: v for k, v in value.items()}
        return value


class _Reply(BaseModel):
    model_config = ConfigDict(extra="ignore")


class AttemptPublic(_Reply):
    number: int
    """From 1."""
    started: float | None
    ended: float | None
    """None for the attempt under way."""
    outcome: AttemptOutcome | str
    """How it ended (succeeded, failed, requeued, stopped, cancelled), or, under way, the workload's state."""
    reason: str | None = None
    """The StopReason that ended it."""
    exit_code: int | None = None
    retried: bool = False
    """Its retry policy started the workload again after it."""


class HistoryItem(_Reply):
    """An earlier workload of the same name in the same project (a rerun, or a replaced spec)."""

    id: int
    state: str
    attempts: int
    created_at: float
    finished_at: float | None
    exit_code: int | None


class ApplyResult(_Reply):
    """What `PUT /workloads/{name}` did: created (a new workload, or a finished one's name run again), unchanged
    (the live workload has this spec: nothing written), or replaced (force: the old one stopped)."""

    id: int
    name: str
    project: str
    state: str
    created: bool = False
    unchanged: bool = False
    replaced: int | None = None
    """The id of the workload it replaced."""
    run: int = 1
    """Its number among its name's runs: past 1, the name had finished and this spec ran it again (or, unchanged,
    the finished run that has this spec)."""


class SpecConflict(_Reply):
    """The 409 of an apply whose spec differs from the live workload's: the fields that differ, old and new."""

    detail: str
    differs: dict[str, dict[str, JsonValue]]
