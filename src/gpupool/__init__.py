"""gpupool: a self-service internal GPU cloud."""

import math

__version__ = "0.1.0"


def report(step: int, value: float) -> None:
    """A sweep trial's intermediate value at `step`: a line on its output that the sweep's study reads (and may
    prune the trial on). The same as printing `gpupool.report step=N value=V`."""
    if not math.isfinite(value) or step < 0:
        raise ValueError("report a finite value at a step >= 0")
    print(f"gpupool.report step={int(step)} value={float(value)!r}", flush=True)


def result(value: float) -> None:
    """A sweep trial's result (without one, its last report is). The same as printing `gpupool.result value=V`."""
    if not math.isfinite(value):
        raise ValueError("a result is a finite value")
    print(f"gpupool.result value={float(value)!r}", flush=True)
