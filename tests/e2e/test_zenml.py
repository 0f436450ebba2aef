"""A real ZenML pipeline (ZenML from PyPI, in an environment of its own with gpupool[zenml]: its pins clash with
the server's) whose three steps run on a real gpupool server through the `gpupool` step operator flavor: each step
is a workload of its own, one on a quarter of a GPU, and the step that fails once is retried by ZenML's own retry
config, as a new workload, while gpupool retries nothing itself."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import Server
from tests.e2e.envs import OPT, environment

ZENML = OPT / "zenml" / "bin" / "zenml"
PIPELINE = """
import json, os
from pathlib import Path

from zenml import pipeline, step
from zenml.client import Client
from zenml.config.retry_config import StepRetryConfig

from gpupool.integrations.zenml import GpupoolStepOperatorSettings as On

MARKER = os.environ.get("MARKER", "")  # the pipeline's process has it; its steps get it from their settings


@step(step_operator=True, settings={"step_operator": On(type="batch")})
def load() -> int:
    return 3


@step(step_operator=True, retry=StepRetryConfig(max_retries=2, delay=0),
      settings={"step_operator": On(gpu=0.25, env={"MARKER": MARKER})})
def train(x: int) -> int:
    marker = Path(os.environ["MARKER"])
    if not marker.exists():
        marker.write_text("failed once")
        raise RuntimeError("the first attempt fails on purpose")
    print("fraction", os.environ.get("GPUPOOL_GPU_FRACTION"), flush=True)
    return 2 * x


@step(step_operator=True)
def report(y: int) -> None:
    print(f"got {y}", flush=True)


@pipeline(enable_cache=False, settings={"step_operator": On(project="vision")})
def three_steps() -> None:
    report(train(load()))


if __name__ == "__main__":
    run = Client().get_pipeline_run(three_steps().id)
    steps = {name: [str(s.status), s.run_metadata.get("gpupool_workload")] for name, s in run.steps.items()}
    print("RUN " + json.dumps({"status": str(run.status), "steps": steps}), flush=True)
"""


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_zenml_pipeline_runs_each_step_as_a_workload_and_zenml_retries_the_failed_one(
    make_server: Callable[..., Server], tmp_path: Path
) -> None:
    python = environment("zenml", checkout="zenml")  # gpupool[zenml] as a user installs it, not editable
    # Single-user: the steps reach the pipeline's SQLite store and local artifact store on this host (a multi-tenant
    # server's sandboxed workloads need a ZenML server and a remote artifact store: docs/zenml.md).
    s = make_server("fake:2xH100-80GB", "--single-user")
    s.cli("project", "create", "vision", "--deserved-gpus", "2")
    ana = s.json("user", "create", "ana", "--project", "vision")["token"]
    project = tmp_path / "pipelines"
    project.mkdir()
    (project / "run.py").write_text(PIPELINE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "ZENML_", "VIRTUAL_ENV"))} | {
        "ZENML_CONFIG_PATH": str(tmp_path / "zenml-config"), "ZENML_ANALYTICS_OPT_IN": "false",
        "GPUPOOL_URL": s.url, "GPUPOOL_TOKEN": ana, "MARKER": str(tmp_path / "failed-once"),
    }  # fmt: skip

    def zenml(*args: str) -> None:
        done = subprocess.run([str(ZENML), *args], cwd=project, env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, f"zenml {' '.join(args)}: {done.stdout}{done.stderr}"

    zenml("init")
    zenml("step-operator", "flavor", "register", "gpupool.integrations.zenml.flavor.GpupoolStepOperatorFlavor")
    zenml("step-operator", "register", "gpupool", "--flavor=gpupool", "--poll_s=0.5")
    zenml("artifact-store", "register", "artifacts", "--flavor=local", f"--path={tmp_path / 'artifacts'}")
    zenml("stack", "register", "on-gpupool", "-o", "default", "-a", "artifacts", "-s", "gpupool", "--set")
    done = subprocess.run([str(python), "run.py"], cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RUN "))
    run = json.loads(line.removeprefix("RUN "))

    workloads = sorted(s.json("list", token=ana), key=lambda w: w["id"])
    seen = [(w["name"].rsplit("-", 1)[0], w["state"], w["type"], w["gpu_request"]) for w in workloads]
    assert seen == [
        ("zenml-load", "succeeded", "batch", "no GPU"),
        ("zenml-train", "failed", "training", "0.25 GPU"),
        ("zenml-train", "succeeded", "training", "0.25 GPU"),
        ("zenml-report", "succeeded", "training", "no GPU"),
    ]
    names = [w["name"] for w in workloads]
    assert run == {
        "status": "completed",
        "steps": {"load": ["completed", f"vision/{names[0]}"], "train": ["completed", f"vision/{names[2]}"],
                  "report": ["completed", f"vision/{names[3]}"]},
    }  # fmt: skip
    described = [s.workload(n, token=ana) for n in names]
    assert [len(d["attempts"]) for d in described] == [1, 1, 1, 1]  # gpupool retried nothing itself
    assert all(d["code"] for d in described)  # each step ran in the pipeline's code, sent along
    assert "the first attempt fails on purpose" in s.cli("logs", names[1], token=ana).stdout
    assert "fraction 0.25" in s.cli("logs", names[2], token=ana).stdout
    assert "got 6" in s.cli("logs", names[3], token=ana).stdout
