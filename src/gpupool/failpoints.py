"""Failpoints: named places where a test can make the server die or fail on purpose.

A test starts a server with `GPUPOOL_FAILPOINTS="name=action[,name=action...]"`; each `failpoint(name)` call
then does what its action says:

* `kill`: the process sends itself SIGKILL (a crash: nothing is flushed, no handler runs);
* `raise`: raises `FailpointError` (a fault the code must survive without a restart);
* `kill@N` / `raise@N`: the same, at the N-th time the point is reached (1-based), and not before.

The variable is read once, when this module is first imported, and only by test runs: with it unset (as in
every real deployment) `failpoint` is a lookup in an empty dict. The names in use are listed in POINTS, so a
test that names one that does not exist fails at once instead of waiting for a crash that never comes.
"""

from __future__ import annotations

import os
import signal
import threading

ENV = "GPUPOOL_FAILPOINTS"

POINTS = frozenset(
    {
        "burst.after-ask",  # a burst node was asked for; its row does not say so yet
        "burst.after-give-back",  # a burst node was given back; its row does not say so yet
        "code.before-mark",  # a member's code is copied into its working directory; not yet marked complete
        "cycle.after-persist",  # the decision is committed; nothing launched or signalled yet
        "cycle.before-events",  # launches and stops done; their events not yet committed
        "launch.before-start",  # the launch intent is durable; the process is not started
        "launch.after-start",  # the process runs; its record is not written yet
        "reclaim.during",  # one member of a stopping workload signalled, the others not yet
    }
)


class FailpointError(RuntimeError):
    """What a `raise` failpoint raises."""


def _parse(text: str) -> dict[str, tuple[str, int]]:
    armed: dict[str, tuple[str, int]] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, _, action = item.partition("=")
        action, _, nth = action.partition("@")
        if name not in POINTS or action not in ("kill", "raise") or (nth and not (nth.isdigit() and int(nth) >= 1)):
            raise ValueError(f"{ENV}: {item!r} is not name=kill|raise[@N] with a name in {sorted(POINTS)}")
        armed[name] = (action, int(nth or 1))
    return armed


_ARMED = _parse(os.environ.get(ENV, ""))
_COUNTS: dict[str, int] = {}
_LOCK = threading.Lock()


def arm(text: str) -> None:
    """Arm failpoints in this process as GPUPOOL_FAILPOINTS would (an in-process test's way); "" disarms all."""
    armed = _parse(text)
    with _LOCK:
        _ARMED.clear()
        _ARMED.update(armed)
        _COUNTS.clear()


def failpoint(name: str) -> None:
    """Do what the test armed at `name`; nothing where it armed nothing (always, outside tests)."""
    if not _ARMED:
        return
    armed = _ARMED.get(name)
    if armed is None:
        return
    action, nth = armed
    with _LOCK:
        _COUNTS[name] = _COUNTS.get(name, 0) + 1
        if _COUNTS[name] != nth:
            return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise FailpointError(f"failpoint {name}")
