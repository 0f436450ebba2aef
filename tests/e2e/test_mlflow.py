"""Experiment tracking with a real MLflow tracking server (installed from PyPI into an environment of its own, whose
dependencies would clash with the server's): a project names the server, a training job's run is made by gpupool
and tagged with who and what ran, and the job's own `mlflow.start_run()` logs a metric and a model into it, which
is then registered and served by an inference workload (MLflow's own model server) through gpupool's proxy."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Server, wait_for
from tests.e2e.envs import OPT
from tests.e2e.envs import mlflow as mlflow

ENV = OPT / "mlflow"
"""Inside the test environment, so a workload's sandbox (which sees that environment, read-only) runs its Python."""
TRAIN = """
import mlflow, mlflow.pyfunc

class Doubler(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input):
        return [2 * x for x in model_input]

with mlflow.start_run() as run:  # the run gpupool made for this attempt (MLFLOW_RUN_ID)
    mlflow.log_metric("loss", 0.25, step=1)
    mlflow.pyfunc.log_model(name="model", python_model=Doubler())
    mlflow.register_model(f"runs:/{run.info.run_id}/model", "doubler")
print("trained", run.info.run_id, flush=True)
"""


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_tracked_job_logs_into_the_run_gpupool_made_and_tagged_and_its_registered_model_is_served(
    make_server: Callable[..., Server], mlflow: str, tmp_path: Path
) -> None:
    config = tmp_path / "settings.yaml"
    config.write_text(f"mlflow_command: {ENV / 'bin' / 'mlflow'}\n")
    s = make_server("fake:2xH100-80GB", "--config", str(config))
    s.cli("project", "create", "vision", "--deserved-gpus", "1")
    assert s.cli("project", "set", "vision", "--mlflow-uri", mlflow).stdout.endswith(f"MLflow {mlflow}\n")
    # The tracking server listens on this host's loopback, which a workload's own network does not reach: the
    # project is granted the host's (a tracking server elsewhere on the network needs no grant).
    s.cli("project", "set", "vision", "--host-network")
    ana = s.json("user", "create", "ana", "--project", "vision")["token"]
    s.cli("submit", "-p", "vision", "--name", "train", "--gpus", "1", "--no-code", "--",
          str(ENV / "bin" / "python"), "-c", TRAIN, token=ana)  # fmt: skip
    done = s.wait_state("train", "succeeded", "failed", timeout=180)
    assert done["state"] == "succeeded", s.cli("logs", "train", token=ana).stdout

    run_id = done["mlflow_run_url"].rsplit("/", 1)[1]
    assert done["mlflow_run_url"].startswith(f"{mlflow}/#/experiments/")
    assert f"trained {run_id}" in s.cli("logs", "train", token=ana).stdout
    run = httpx.get(f"{mlflow}/api/2.0/mlflow/runs/get", params={"run_id": run_id}).json()["run"]
    tags = {t["key"]: t["value"] for t in run["data"]["tags"] if t["key"].startswith("gpupool.")}
    assert tags == {
        "gpupool.attempt": f"{done['id']}-0", "gpupool.workload": "vision/train",
        "gpupool.workload_id": str(done["id"]), "gpupool.project": "vision", "gpupool.user": "ana",
        "gpupool.gpus": "1", "gpupool.workers": "1",
    }  # fmt: skip
    assert [(m["key"], m["value"]) for m in run["data"]["metrics"]] == [("loss", 0.25)]
    experiment = httpx.get(f"{mlflow}/api/2.0/mlflow/experiments/get",
                           params={"experiment_id": run["info"]["experiment_id"]}).json()  # fmt: skip
    assert experiment["experiment"]["name"] == "vision"
    versions = httpx.get(f"{mlflow}/api/2.0/mlflow/registered-models/get-latest-versions",
                         params={"name": "doubler"}).json()["model_versions"]  # fmt: skip
    assert [(v["version"], v["run_id"]) for v in versions] == [("1", run_id)]
    described = s.cli("describe", "train", token=ana).stdout
    assert f"MLflow run:  {done['mlflow_run_url']}\n" in described

    # The registered model, served on a quarter of a GPU by an inference workload with no command of its own.
    s.cli("project", "set", "vision", "--production-allowed")
    s.cli("submit", "-p", "vision", "--type", "inference", "--name", "serve", "--gpu", "0.25", "--no-code",
          "--model", "models:/doubler/1", token=ana)  # fmt: skip
    serving = s.wait_state("serve", "running", "failed", timeout=120)
    assert serving["state"] == "running", s.cli("logs", "serve", token=ana).stdout
    assert serving["model"] == "models:/doubler/1"
    assert serving["mlflow_run_url"] is None  # serving makes no run
    assert "Model:       models:/doubler/1\n" in s.cli("describe", "serve", token=ana).stdout
    url = f"{s.url}/apps/vision/serve/invocations"
    auth = {"Authorization": f"Bearer {ana}"}

    def predicted() -> dict[str, object] | None:
        try:
            r = httpx.post(url, json={"inputs": [1, 2, 3]}, headers=auth, timeout=10)
        except httpx.HTTPError:
            return None
        return r.json() if r.status_code == 200 else None

    assert wait_for(predicted, 180, "a prediction through gpupool's proxy") == {"predictions": [2, 4, 6]}
    assert httpx.post(url, json={"inputs": [1]}, timeout=10).status_code == 401


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_model_is_served_only_by_an_inference_workload_with_a_tracking_server(
    make_server: Callable[..., Server],
) -> None:
    s = make_server("fake:1xH100-80GB")
    s.cli("project", "create", "vision", "--deserved-gpus", "1")
    base = ["submit", "-p", "vision", "--no-code", "--gpu", "0.5", "--model", "models:/doubler/1"]
    cases = {
        ("--type", "training"): "--model serves a model: it goes with --type inference, not training",
        ("--type", "inference"): "--model needs an MLflow tracking server: --mlflow URL, or `gpupool project set "
        "--mlflow-uri`",
        ("--type", "inference", "--mlflow", "http://127.0.0.1:9", "--", "python", "x.py"): "--model runs MLflow's "
        "model server: leave out the command",
    }
    for extra, message in cases.items():
        done = s.cli(*base, *extra, check=False)
        assert done.returncode == 1 and message in done.stderr, (extra, done.stderr)
    bad = s.cli("submit", "-p", "vision", "--no-code", "--type", "inference", "--model", "s3://bucket/m", check=False)
    assert (bad.returncode, bad.stderr) == (
        2,
        "error: model: Value error, expected an MLflow model URI: models:/NAME/VERSION, "
        "models:/NAME@ALIAS or runs:/RUN/PATH\n",
    ), bad.stderr
    assert s.json("list") == []
