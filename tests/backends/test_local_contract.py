"""The local backend keeps the backend contract, plain and sandboxed: one test per promise (see contract.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpupool.backends.base import DeviceGrant, LaunchSpec
from gpupool.backends.local import LocalBackend, discover
from gpupool.backends.local.sandbox import probe
from tests.backends.contract import BackendContract, Harness, Member

GRANT = (DeviceGrant(0, 1000, 81920, "H100", 81920),)


def spec(m: Member) -> LaunchSpec:
    if m.port is not None:  # an inference service: sandboxed, its port is bridged to the app socket
        argv: tuple[str, ...] = ("python3", "-m", "http.server", str(m.port), "--bind", "127.0.0.1")
        return LaunchSpec(m.alloc, m.workload_id, "w", "p", "inference", argv, {}, GRANT, port=m.port, project_id=3)
    script = '[ -n "$1" ] && printf "%s\\n" "$1"; sleep "$2"; exit "$3"'
    argv = ("sh", "-c", script, "member", m.says or "", f"{m.seconds:g}", str(m.exit_code))
    return LaunchSpec(m.alloc, m.workload_id, "w", "p", "training", argv, {}, GRANT, project_id=3)


def _harness(backend: LocalBackend) -> Iterator[Harness]:
    h = Harness(backend, spec)
    yield h
    for alloc in list(backend.observe()):  # whatever a failed test left running
        backend.stop(alloc, force=True)


# One backend per class: every member has an allocation and a workload id of its own, and a sandboxed backend
# takes seconds to start (it checks that JupyterLab runs inside the sandbox).


class TestLocalBackend(BackendContract):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
        root = tmp_path_factory.mktemp("local")
        yield from _harness(LocalBackend(root, "host", "default", discover("fake:2xH100-80GB")))


class TestSandboxedLocalBackend(BackendContract):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
        root, gpus = tmp_path_factory.mktemp("sandboxed"), discover("fake:2xH100-80GB")
        yield from _harness(LocalBackend(root, "host", "default", gpus, isolation=probe(False)))
