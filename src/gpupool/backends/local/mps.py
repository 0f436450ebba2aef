"""CUDA MPS: where `nvidia-cuda-mps-control` exists, fractions run under a limit the driver enforces."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


class MpsDaemon:
    """One MPS control daemon for this server, with its pipes under the data dir."""

    def __init__(self, root: Path) -> None:
        self.pipe_dir = root / "pipe"
        self.log_dir = root / "log"
        self._started = False

    def ensure(self) -> bool:
        if self._started:
            return True
        binary = shutil.which("nvidia-cuda-mps-control")
        if binary is None:
            return False
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(self.pipe_dir), CUDA_MPS_LOG_DIRECTORY=str(self.log_dir))
        result = subprocess.run([binary, "-d"], env=env, capture_output=True, timeout=30, check=False)
        # A daemon already serving this pipe directory answers with an error but is what we want.
        self._started = result.returncode == 0 or (self.pipe_dir / "control").exists()
        return self._started


def mps_env(daemon: MpsDaemon, milli: int, memory_mib: int) -> dict[str, str]:
    """The member sees one device (index 0 after CUDA_VISIBLE_DEVICES), limited in memory and SM share."""
    return {
        "CUDA_MPS_PIPE_DIRECTORY": str(daemon.pipe_dir),
        "CUDA_MPS_LOG_DIRECTORY": str(daemon.log_dir),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={memory_mib}M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, milli // 10)),
    }
