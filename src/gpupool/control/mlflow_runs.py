"""A tracked workload's MLflow run: made on its tracking server before each attempt launches, through MLflow's REST
API (no MLflow package on the server), tagged with the workload, its project, its owner and its GPUs, and given to
its processes as MLFLOW_TRACKING_URI and MLFLOW_RUN_ID, so that `mlflow.start_run()` there logs into it.

Once per attempt: the run carries the tag `gpupool.attempt` = `<workload>-<attempt>`, and is looked up by it before
one is made, so a launch tried again (or a hub that crashed after making the run) finds it and makes no second."""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx

from gpupool.store.tables import WorkloadRow

log = logging.getLogger("gpupool.mlflow")

TIMEOUT_S = 5.0
API = "/api/2.0/mlflow"


class MlflowError(RuntimeError):
    pass


def run_url(mlflow: dict[str, Any] | None) -> str | None:
    """Where the run is in MLflow's UI."""
    if not mlflow or not mlflow.get("run_id"):
        return None
    return f"{str(mlflow['uri']).rstrip('/')}/#/experiments/{mlflow['experiment_id']}/runs/{mlflow['run_id']}"


def environment(row: WorkloadRow, project: str, owner: str) -> dict[str, str]:
    """The run of the row's current attempt (made if it has none yet; the row then records it) as environment.
    A served model makes no run: its server only reads the registry."""
    m = dict(row.mlflow or {})
    uri = str(m["uri"]).rstrip("/")
    if m.get("model"):
        return {"MLFLOW_TRACKING_URI": uri}
    if m.get("attempt") != row.attempt or not m.get("run_id"):
        experiment, run = _ensure(uri, row, project, owner)
        row.mlflow = m | {"experiment_id": experiment, "run_id": run, "attempt": row.attempt}
        m = row.mlflow
    run, experiment = str(m["run_id"]), str(m["experiment_id"])
    return {"MLFLOW_TRACKING_URI": uri, "MLFLOW_RUN_ID": run, "MLFLOW_EXPERIMENT_ID": experiment}


def _ensure(uri: str, row: WorkloadRow, project: str, owner: str) -> tuple[str, str]:
    key = f"{row.id}-{row.attempt}"
    with httpx.Client(base_url=uri, timeout=TIMEOUT_S) as http:
        experiment = _experiment(http, project)
        found = _call(http, "POST", "/runs/search", {
            "experiment_ids": [experiment], "filter": f"tags.`gpupool.attempt` = '{key}'", "max_results": 1,
        }).get("runs") or []  # fmt: skip
        if found:
            return experiment, str(found[0]["info"]["run_id"])
        gpus = row.gpus if row.gpus else row.gpu_milli / 1000
        tags = {
            "gpupool.attempt": key, "gpupool.workload": f"{project}/{row.name}", "gpupool.workload_id": str(row.id),
            "gpupool.project": project, "gpupool.user": owner, "gpupool.gpus": f"{gpus:g}",
            "gpupool.workers": str(row.workers), "mlflow.user": owner,
        }  # fmt: skip
        made = _call(http, "POST", "/runs/create", {
            "experiment_id": experiment, "run_name": f"{row.name}-{row.attempt}", "start_time": int(time.time() * 1000),
            "tags": [{"key": k, "value": v} for k, v in tags.items()],
        })  # fmt: skip
        run = str(made["run"]["info"]["run_id"])
        log.info("workload %d: MLflow run %s on %s", row.id, run, uri)
        return experiment, run


def _experiment(http: httpx.Client, name: str) -> str:
    """The project's experiment (made if it does not exist)."""
    r = http.get(f"{API}/experiments/get-by-name", params={"experiment_name": name})
    if r.status_code == 200:
        return str(r.json()["experiment"]["experiment_id"])
    if r.status_code != 404:
        raise MlflowError(f"MLflow answered {r.status_code}: {r.text[:200]}")
    made = http.post(f"{API}/experiments/create", json={"name": name})
    if made.status_code == 200:
        return str(made.json()["experiment_id"])
    again = http.get(f"{API}/experiments/get-by-name", params={"experiment_name": name})  # made meanwhile
    if again.status_code != 200:
        raise MlflowError(f"MLflow answered {made.status_code}: {made.text[:200]}")
    return str(again.json()["experiment"]["experiment_id"])


def _call(http: httpx.Client, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = http.request(method, f"{API}{path}", json=body)
    if r.status_code != 200:
        raise MlflowError(f"MLflow answered {r.status_code}: {r.text[:200]}")
    out: dict[str, Any] = r.json()
    return out


MODEL_DIR = ".gpupool-model"
"""Where a served model is downloaded to, in the member's working directory."""
# `mlflow` starts uvicorn by name: the environment it comes from goes first on PATH.
_ITS_PATH = 'PATH="$(dirname "$(command -v "$0")"):$PATH"; export PATH; '


def serving(mlflow: str, model: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The (init, argv) of a member serving `model` with MLflow's model server, `mlflow` being the executable.
    The model is downloaded first, with the network, so the server needs none but its port's (a service on the
    local backend has a network of its own, reached only through gpupool's proxy)."""
    fetch = 'rm -rf "$2"; exec "$0" artifacts download -u "$1" -d "$2"'
    init = ("/bin/sh", "-c", _ITS_PATH + fetch, mlflow, model, MODEL_DIR)
    serve = 'exec "$0" models serve -m "$1" --env-manager local --host 0.0.0.0 --port "$PORT"'
    return init, ("/bin/sh", "-c", _ITS_PATH + serve, mlflow, MODEL_DIR)
