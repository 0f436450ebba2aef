"""The local backend passes the backend contract."""

from __future__ import annotations

from pathlib import Path

from gpupool.backends.base import DeviceGrant, LaunchSpec
from gpupool.backends.local import LocalBackend, discover
from gpupool.backends.local.sandbox import probe
from tests.backends.contract import Harness, run_contract


def test_the_local_backend_keeps_the_contract(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, "host", "default", discover("fake:2xH100-80GB"))

    def spec(alloc: str, seconds: float, code: int) -> LaunchSpec:
        argv = ("sh", "-c", f"sleep {seconds}; exit {code}")
        return LaunchSpec(alloc, 1, "w", "p", "training", argv, {}, (DeviceGrant(0, 1000, 81920, "H100", 81920),))

    run_contract(Harness(backend, spec), "c")


def test_the_sandboxed_local_backend_keeps_the_contract(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, "host", "default", discover("fake:2xH100-80GB"), isolation=probe(False))

    def spec(alloc: str, seconds: float, code: int) -> LaunchSpec:
        argv = ("sh", "-c", f"sleep {seconds}; exit {code}")
        grant = (DeviceGrant(0, 1000, 81920, "H100", 81920),)
        return LaunchSpec(alloc, 1, "w", "p", "training", argv, {}, grant, project_id=3)

    run_contract(Harness(backend, spec), "s")
