"""The local backend on its own: the GPU spec grammar, idempotent launches, exit codes, stop, re-adoption."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpupool.backends.base import DeviceGrant, LaunchSpec
from gpupool.backends.local import GpuSpecError, LocalBackend, discover, parse_fake
from gpupool.core import Device


def test_the_fake_gpu_grammar() -> None:
    assert parse_fake("fake:2xH100-80GB,1xL4-24GB") == (
        Device(0, "H100", 80 * 1024),
        Device(1, "H100", 80 * 1024),
        Device(2, "L4", 24 * 1024),
    )
    assert parse_fake("fake:1xA100-SXM4-40GB") == (Device(0, "A100-SXM4", 40 * 1024),)
    for bad in ("fake:", "fake:2H100-80GB", "fake:0xH100-80GB", "fake:2xH100", "fake:2xH100-80", "2xH100-80GB"):
        with pytest.raises(GpuSpecError):
            parse_fake(bad)
    with pytest.raises(GpuSpecError):
        discover("cuda")
    assert discover("fake:1xT4-16GB").simulated


def _backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(tmp_path, "host", "default", discover("fake:2xH100-80GB"))


def _spec(alloc: str, argv: tuple[str, ...], **kw: object) -> LaunchSpec:
    return LaunchSpec(alloc, 1, "w", "p", "training", argv, {}, **kw)  # type: ignore[arg-type]


def _until(backend: LocalBackend, alloc: str, alive: bool, timeout: float = 10.0) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = backend.observe()[alloc]
        if seen.alive == alive:
            return seen.exit_code
        time.sleep(0.02)
    raise AssertionError(f"{alloc} did not become {'alive' if alive else 'ended'}")


def test_a_launch_is_keyed_by_its_allocation_and_reports_its_exit_code(tmp_path: Path) -> None:
    b = _backend(tmp_path)
    grant = DeviceGrant(1, 250, 20480, "H100", 81920)
    argv = ("sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES $GPUPOOL_GPU_FRACTION $HOSTILE"; exit 4')
    spec = LaunchSpec("1-0-0", 1, "w", "p", "training", argv, {"HOSTILE": "$(rm -rf /);`id`"}, (grant,))
    b.launch(spec)
    b.launch(spec)  # a retry: never a second copy
    assert _until(b, "1-0-0", alive=False) == 4
    log = Path(b.log_path(1, 0)).read_text()
    assert log == "1 0.250 $(rm -rf /);`id`\n"  # one run; words are passed, never interpreted
    # The server's own environment (a database URL, say) never reaches a workload.
    os.environ["GPUPOOL_SECRET_FOR_TEST"] = "x"
    try:
        b.launch(_spec("1-1-0", ("sh", "-c", "env")))
        _until(b, "1-1-0", alive=False)
    finally:
        del os.environ["GPUPOOL_SECRET_FOR_TEST"]
    assert "GPUPOOL_SECRET_FOR_TEST" not in Path(b.log_path(1, 0)).read_text()
    b.forget("1-0-0")
    assert "1-0-0" not in b.observe()


def test_stop_asks_then_forces_and_a_new_backend_adopts_running_members(tmp_path: Path) -> None:
    b = _backend(tmp_path)
    b.launch(_spec("2-0-0", ("sh", "-c", "trap 'echo term' TERM; echo ready; while true; do sleep 0.05; done")))
    log = Path(b.log_path(1, 0))
    deadline = time.monotonic() + 10
    while not (log.exists() and "ready" in log.read_text()):  # its trap is set
        assert time.monotonic() < deadline, "the member never got ready"
        time.sleep(0.02)
    again = _backend(tmp_path)  # as after a server restart
    assert again.observe()["2-0-0"].alive
    again.stop("2-0-0", force=False)
    while "term" not in log.read_text():  # its trap ran; the member must survive it
        assert time.monotonic() < deadline + 10, "the member never saw its TERM"
        time.sleep(0.02)
    assert again.observe()["2-0-0"].alive
    again.stop("2-0-0", force=True)
    assert _until(again, "2-0-0", alive=False) is None  # killed: no status to report
