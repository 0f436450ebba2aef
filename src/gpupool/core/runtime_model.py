"""How long work runs, predicted from the runtimes of work that finished: the start-time forecast's input.

Users' own estimates are modal and loose (a few round values, often the maximum allowed), and a predictor from
the user's recent history beats them (Tsafrir, Etsion and Feitelson, IEEE TPDS 2007); the declared duration
stays what it is for, a kill time, and caps the prediction. The model keeps the last `window` runtimes per
project and workload type and predicts a quantile of them, falling back to the type's runtimes across
projects, then to everything, when a key has fewer than `min_samples`. Running work is predicted from the
runtimes longer than what it has already run (a prediction proved too short is corrected as it ages); work
that has outrun every runtime seen is expected to run as long again.

Deterministic: the prediction depends only on the observations in the order given.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass


class Basis(enum.Enum):
    """What a runtime or a start-time estimate rests on, from firmest to none."""

    DECLARED = "declared"
    """The workload's declared maximum duration (enforced, so an upper bound), or nothing uncertain at all."""
    HISTORY = "history"
    """Runtimes of the project's and type's finished work."""
    NONE = "none"
    """Nothing to go by: it is expected to run until stopped."""


@dataclass(frozen=True, slots=True)
class Runtime:
    """A workload's expected total running time from its (next) start, and what that rests on."""

    seconds: float | None
    """None: not expected to end (a service, or nothing declared and no history)."""
    basis: Basis


UNKNOWN = Runtime(None, Basis.NONE)


class RuntimeModel:
    def __init__(self, window: int = 32, quantile: float = 0.5, min_samples: int = 3) -> None:
        if window < 1 or min_samples < 1 or not 0.0 <= quantile <= 1.0:
            raise ValueError("window and min_samples must be at least 1, quantile within 0..1")
        self.window, self.quantile, self.min_samples = window, quantile, min_samples
        self._seen: dict[tuple[str, ...], deque[float]] = {}

    def observe(self, project: str, kind: str, runtime_s: float) -> None:
        """Record the running time of a finished workload of `project` and workload type `kind`."""
        for key in ((project, kind), (kind,), ()):
            self._seen.setdefault(key, deque(maxlen=self.window)).append(max(0.0, runtime_s))

    def predict(self, project: str, kind: str, elapsed_s: float = 0.0) -> float | None:
        """Expected total running time of work that has run `elapsed_s` so far; None without any history."""
        for key in ((project, kind), (kind,), ()):
            seen = self._seen.get(key)
            if not seen:
                continue
            longer = sorted(r for r in seen if r > elapsed_s)
            if len(longer) >= self.min_samples or (key == () and longer):
                return longer[min(len(longer) - 1, int(self.quantile * len(longer)))]
        if not self._seen.get(()):
            return None
        return 2 * elapsed_s if elapsed_s > 0 else None

    def expect(self, project: str, kind: str, declared_s: float | None, elapsed_s: float = 0.0) -> Runtime:
        """The runtime a forecast should assume: the history's prediction capped by the declared maximum (the
        work is stopped there), else the declared maximum, else unknown."""
        predicted = self.predict(project, kind, elapsed_s)
        if predicted is not None and (declared_s is None or predicted < declared_s):
            return Runtime(predicted, Basis.HISTORY)
        if declared_s is not None:
            return Runtime(declared_s, Basis.DECLARED)
        return UNKNOWN
