import os
from pathlib import Path

import pytest

SHARED = Path(os.environ.get("GPUPOOL_SHARED") or Path(__file__).resolve().parents[3] / "shared")
"""The project's shared folder (beside the repository, in CI too); GPUPOOL_SHARED points elsewhere."""
ALIBABA = SHARED / "traces" / "alibaba-gpu-v2023" / "csv"
PHILLY = SHARED / "traces" / "philly-pollux" / "philly.csv"


@pytest.fixture(scope="session")
def alibaba() -> Path:
    assert ALIBABA.is_dir(), f"the shared traces are expected at {ALIBABA}"
    return ALIBABA


@pytest.fixture()
def small_trace(tmp_path: Path, alibaba: Path) -> tuple[Path, Path]:
    """A slice of the real trace: 60 GPU nodes of mixed models and the first 400 pods."""
    node_lines = (alibaba / "openb_node_list_gpu_node.csv").read_text().splitlines()
    header, rows = node_lines[0], node_lines[1:]
    picked = rows[::20][:60]
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("\n".join([header, *picked]) + "\n")
    pods = tmp_path / "pods.csv"
    pods.write_text("\n".join((alibaba / "openb_pod_list_default.csv").read_text().splitlines()[:401]) + "\n")
    return nodes, pods
