"""`gpupool list --state` takes several states, repeated or separated by commas, and refuses one it does not know
with the states it does, before any server is asked (none is configured here)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpupool.lifecycle.phases import Phase
from gpupool.models.wire import states_named
from tests.e2e.conftest import GPUPOOL

STATES = "pending, starting, running, preempted, suspended, succeeded, failed, cancelled"


def test_states_are_read_repeated_or_separated_by_commas_each_once_in_the_order_given() -> None:
    assert states_named(["running,pending", "failed", " pending , succeeded"]) == [
        Phase.RUNNING, Phase.PENDING, Phase.FAILED, Phase.SUCCEEDED,
    ]  # fmt: skip
    assert states_named([]) == []


@pytest.mark.parametrize(("args", "bad"), [(["sleeping"], "sleeping"), (["running,", "pending"], ""),
                                           (["running,Pending"], "Pending")])  # fmt: skip
def test_an_unknown_state_is_refused_with_the_states_there_are(tmp_path: Path, args: list[str], bad: str) -> None:
    flags = [a for value in args for a in ("--state", value)]
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    done = subprocess.run([GPUPOOL, "list", *flags], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert (done.returncode, done.stderr) == (2, f"error: --state {bad!r} is not a state; the states: {STATES}\n")
