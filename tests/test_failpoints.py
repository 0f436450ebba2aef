"""Failpoints: armed by GPUPOOL_FAILPOINTS (or arm() in-process), each fires once, at its N-th reach."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from gpupool import failpoints
from gpupool.failpoints import ENV, POINTS, FailpointError, arm, failpoint


@pytest.fixture(autouse=True)
def disarmed() -> Iterator[None]:
    arm("")
    yield
    arm("")


def _fired(name: str, times: int) -> list[int]:
    """At which reaches (1-based) of `times` a raise fired."""
    out = []
    for i in range(1, times + 1):
        try:
            failpoint(name)
        except FailpointError as e:
            assert str(e) == f"failpoint {name}"
            out.append(i)
    return out


def test_an_unarmed_point_does_nothing() -> None:
    assert [_fired(name, 3) for name in sorted(POINTS)] == [[]] * 8


def test_a_raise_fires_once_at_its_nth_reach_and_each_point_counts_its_own() -> None:
    arm("cycle.after-persist=raise, reclaim.during=raise@3")
    assert _fired("cycle.before-events", 5) == []
    assert _fired("reclaim.during", 5) == [3]
    assert _fired("cycle.after-persist", 5) == [1]


def test_arming_again_replaces_what_was_armed_and_starts_the_counts_over() -> None:
    arm("launch.after-start=raise@2")
    assert _fired("launch.after-start", 1) == []
    arm("launch.after-start=raise@2")
    assert _fired("launch.after-start", 3) == [2]
    arm("")
    assert _fired("launch.after-start", 3) == []


def test_threads_reaching_a_point_together_fire_it_exactly_once() -> None:
    arm("launch.before-start=raise@100")
    fired: list[str] = []
    start = threading.Barrier(8)

    def reach() -> None:
        start.wait()
        for _ in range(50):
            try:
                failpoint("launch.before-start")
            except FailpointError:
                fired.append(threading.current_thread().name)

    threads = [threading.Thread(target=reach) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fired) == 1


@pytest.mark.parametrize(
    "text",
    [
        "cycle.after-persit=raise",  # a typo of a point
        "cycle.after-persist=crash",
        "cycle.after-persist=kill@x",
        "cycle.after-persist=kill@-1",
        "cycle.after-persist",
        "cycle.after-persist=kill@0",  # reaches count from 1: it would never fire
    ],
)
def test_what_is_not_a_point_and_an_action_is_refused_at_once(text: str) -> None:
    with pytest.raises(ValueError, match=f"^{ENV}: '"):
        arm(text)
    assert failpoints._ARMED == {}  # nothing of it was armed


def _python(code: str, armed: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != ENV} | {ENV: armed}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_the_variable_arms_a_new_process_and_kill_is_a_sigkill_at_the_nth_reach() -> None:
    code = "from gpupool.failpoints import failpoint\nfor i in (1, 2, 3):\n    print(i, flush=True)\n"
    code += "    failpoint('launch.after-start')"
    done = _python(code, "launch.after-start=kill@2")
    assert (done.returncode, done.stdout.split()) == (-signal.SIGKILL, ["1", "2"])


def test_a_process_started_with_a_bad_variable_fails_at_import() -> None:
    done = _python("import gpupool.failpoints", "no.such.point=kill")
    assert done.returncode == 1
    assert f"ValueError: {ENV}: 'no.such.point=kill' is not name=kill|raise[@N]" in done.stderr
