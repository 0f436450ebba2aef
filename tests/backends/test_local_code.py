"""The local backend starts a workload in a private copy of its code, made exactly once: a crash before the copy is
marked in place copies it again from scratch, one after it starts the member in that copy, and a member that has
run is never copied over. Real processes; the code is packed by the client's own packer (gpupool.client.code)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpupool import failpoints
from gpupool.backends.base import LaunchSpec
from gpupool.backends.local import LocalBackend
from gpupool.backends.local.workdirs import Blobs
from gpupool.client.code import pack
from gpupool.store.blobs import CHUNK_BYTES, BlobStore, blob_root, digest_of
from tests.backends import test_local_launch
from tests.e2e.conftest import wait_for


@dataclass(frozen=True, slots=True)
class CodeSpec(LaunchSpec):
    """A launch with code, as the controller makes one once LaunchSpec carries `code`."""

    code: str | None = None


backends = test_local_launch.backends
"""The launch tests' fixture: backends on tmp_path/data, whose members are killed at the end."""


@pytest.fixture
def arm(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    def set_points(name: str) -> None:  # armed in-process: these tests drive the backend, not a server
        monkeypatch.setattr(failpoints, "_ARMED", {name: ("raise", 1)})
        monkeypatch.setattr(failpoints, "_COUNTS", {})

    return set_points


def _uploaded(tmp_path: Path, chunk_bytes: int = CHUNK_BYTES) -> str:
    """A code tree in the data dir's blob area, as the API stores one; its digest."""
    src = tmp_path / "src"
    (src / "lib").mkdir(parents=True)
    (src / "train.py").write_text(
        "import pathlib\n"
        "data = pathlib.Path('data.csv').read_text()\n"
        "pathlib.Path('out.txt').write_text(f'{len(data.splitlines())} rows\\n')\n"
    )
    (src / "data.csv").write_text("a,b\n1,2\n3,4\n")
    (src / "lib" / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "lib" / "run.sh").chmod(0o755)
    (src / "data-link.csv").symlink_to("data.csv")
    (src / "big.bin").write_bytes(os.urandom(3 * chunk_bytes // 2))
    (src / "scratch.log").write_text("not sent\n")
    (src / ".gitignore").write_text("*.log\n")
    packed = pack(src, 10 * 2**20, chunk_bytes)
    store = BlobStore(blob_root(tmp_path / "data"))
    for digest, chunk in packed.chunks.items():
        with open(chunk.path, "rb") as f:
            f.seek(chunk.offset)
            store.put(digest, f.read(chunk.size))
    body = packed.manifest.canonical()
    store.put(digest_of(body), body)
    return digest_of(body)


def _spec(alloc: str, code: str, argv: tuple[str, ...], rank: int = 0) -> CodeSpec:
    return CodeSpec(alloc, 7, "w", "p", "training", argv, {}, rank=rank, world_size=2, code=code)


def _tree(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = f"-> {os.readlink(p)}"
        elif p.is_file():
            out[rel] = f"{p.stat().st_mode & 0o777:o} {p.stat().st_size}"
    return out


def test_the_member_runs_in_a_copy_of_its_code_and_writes_beside_it(
    backends: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    code = _uploaded(tmp_path)
    b = backends()
    b.launch(_spec("7-0-0", code, ("python3", "train.py")))
    wait_for(lambda: not b.observe()["7-0-0"].alive, 30, "the member to end")
    assert b.observe()["7-0-0"].exit_code == 0
    workdir = tmp_path / "data" / "workloads" / "7"
    assert (workdir / "out.txt").read_text() == "3 rows\n"
    assert _tree(workdir) == {
        ".gitignore": "644 6",
        "big.bin": f"644 {3 * CHUNK_BYTES // 2}",
        "data-link.csv": "-> data.csv",
        "data.csv": "644 12",
        "lib/run.sh": "755 19",
        "out.txt": "644 7",
        "train.py": f"644 {(tmp_path / 'src' / 'train.py').stat().st_size}",
    }
    assert (workdir / "big.bin").read_bytes() == (tmp_path / "src" / "big.bin").read_bytes()
    # A copy, not a link to the blob: the job's writes never reach the blob area.
    blob = Blobs(tmp_path / "data").path(code)
    assert os.stat(workdir / "train.py").st_ino != blob.stat().st_ino


def test_a_crash_after_the_copy_before_its_mark_copies_it_again_and_starts_once(
    backends: Callable[..., LocalBackend], arm: Callable[[str], None], tmp_path: Path
) -> None:
    code = _uploaded(tmp_path)
    starts = tmp_path / "starts"
    spec = _spec("7-0-0", code, ("sh", "-c", f"echo start >> {starts}; ls > listing; exec sleep 600"))
    arm("code.before-mark")
    with pytest.raises(failpoints.FailpointError):
        backends().launch(spec)
    workdir = tmp_path / "data" / "workloads" / "7"
    (workdir / "stray").write_text("a crash left this\n")  # no member ever ran here: the next copy is fresh
    again = backends()  # as after a restart
    assert again.observe() == {}
    again.launch(spec)
    wait_for(lambda: (workdir / "listing").exists(), 20, "the member to start")
    assert starts.read_text() == "start\n"
    assert not (workdir / "stray").exists()


def test_a_crash_after_the_mark_before_the_start_keeps_the_copy_and_starts_once(
    backends: Callable[..., LocalBackend], arm: Callable[[str], None], tmp_path: Path
) -> None:
    code = _uploaded(tmp_path)
    starts = tmp_path / "starts"
    spec = _spec("7-0-0", code, ("sh", "-c", f"echo start >> {starts}; exec sleep 600"))
    arm("launch.before-start")
    with pytest.raises(failpoints.FailpointError):
        backends().launch(spec)
    workdir = tmp_path / "data" / "workloads" / "7"
    (workdir / "train.py").write_text("# edited in place\n")
    again = backends()
    again.launch(spec)
    wait_for(lambda: starts.exists(), 20, "the member to start")
    again.launch(spec)
    assert starts.read_text() == "start\n"
    assert (workdir / "train.py").read_text() == "# edited in place\n"  # placed once: never copied over


def test_gang_members_share_one_copy_and_a_later_member_never_copies_over_an_earlier_ones_work(
    backends: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    code = _uploaded(tmp_path)
    b = backends()
    workdir = tmp_path / "data" / "workloads" / "7"
    b.launch(_spec("7-0-0", code, ("sh", "-c", "echo zero > rank0.txt; exec sleep 600")))
    wait_for(lambda: (workdir / "rank0.txt").exists(), 20, "member 0 to write")
    b.launch(_spec("7-0-1", code, ("sh", "-c", "cat rank0.txt > rank1.txt"), rank=1))
    wait_for(lambda: not b.observe()["7-0-1"].alive, 20, "member 1 to end")
    assert (workdir / "rank1.txt").read_text() == "zero\n"
    assert (tmp_path / "data" / "workloads" / "7.code").read_text() == code


def test_the_backend_reads_blobs_where_the_api_writes_them(tmp_path: Path) -> None:
    data = b"the same layout on both sides"
    BlobStore(blob_root(tmp_path)).put(digest_of(data), data)
    assert Blobs(tmp_path).read(digest_of(data)) == data
