"""What `gpupool submit` refuses before it asks a server (none is configured here): each refusal names the flag
as the user typed it, exits 2, and --help says which units a size is read in."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import GPUPOOL

UNITS = "GB = 10^9 bytes, GiB = 2^30; also MB, MiB, TB, TiB and Kubernetes' G, Gi; a bare number is MiB"


def gpupool(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "COLUMNS": "250"}
    return subprocess.run([GPUPOOL, *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--gpu", "1.5"], "--gpu 1.5 is not a fraction between 0 and 1; ask for whole GPUs with --gpus"),
        (["--memory", "16XB"], f"Invalid value for '--memory': '16XB': unknown unit 'XB'; {UNITS} "
         "(see gpupool submit --help)"),
        (["--gpu-memory", "lots"], "Invalid value for '--gpu-memory': 'lots': expected a size like 20GiB or 512MiB "
         f"({UNITS}) (see gpupool submit --help)"),
    ],
)  # fmt: skip
def test_a_flag_the_server_would_refuse_is_refused_first_in_the_flags_words(
    tmp_path: Path, args: list[str], error: str
) -> None:
    done = gpupool(tmp_path, "submit", "-p", "vision", *args, "--", "true")
    assert (done.returncode, done.stderr) == (2, f"error: {error}\n")


def test_help_says_which_unit_a_size_is_in(tmp_path: Path) -> None:
    shown = " ".join(gpupool(tmp_path, "submit", "--help").stdout.replace("│", " ").split())
    assert f"Host memory per member, e.g. 16GiB ({UNITS})." in shown
    assert f"GPU memory, e.g. 20GiB ({UNITS})." in shown
