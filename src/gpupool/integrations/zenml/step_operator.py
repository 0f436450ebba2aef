"""The step operator: a step is submitted as a gpupool workload and followed until it ends. ZenML's own retry
config retries a failed step (a new step run, so a new workload); gpupool never retries one itself, since the
step run it would start again has already published its failure."""

from __future__ import annotations

import os
import re
import sys
import time
from typing import TYPE_CHECKING, Any, cast

from zenml.enums import ExecutionStatus
from zenml.logger import get_logger
from zenml.orchestrators.publish_utils import publish_step_run_metadata
from zenml.step_operators import BaseStepOperator
from zenml.step_operators.step_operator_entrypoint_configuration import StepOperatorEntrypointConfiguration
from zenml.utils import source_utils

from gpupool.cli import contexts
from gpupool.client import ApiError, Client
from gpupool.client.code import upload_tree
from gpupool.integrations.zenml.flavor import GpupoolStepOperatorConfig, GpupoolStepOperatorSettings
from gpupool.models.schemas import WorkloadCreate

if TYPE_CHECKING:
    from zenml.config.base_settings import BaseSettings
    from zenml.config.step_run_info import StepRunInfo
    from zenml.models import StepRunResponse

log = get_logger(__name__)
WORKLOAD = "gpupool_workload"
"""The step run's metadata key naming its workload (`project/name`), which ZenML's dashboard shows too."""
SOURCE_ROOT = "ZENML_GPUPOOL_SOURCE_ROOT"
STATUS = {
    "succeeded": ExecutionStatus.COMPLETED,
    "failed": ExecutionStatus.FAILED,
    "cancelled": ExecutionStatus.CANCELLED,
    "starting": ExecutionStatus.RUNNING,
    "running": ExecutionStatus.RUNNING,
}
"""gpupool's workload states as ZenML's; the rest (pending, preempted: queued again) are QUEUED."""


class GpupoolEntrypointConfiguration(StepOperatorEntrypointConfiguration):  # type: ignore[misc]
    """ZenML's, except that the step stays in its workload's directory: ZenML's moves to /app, which it makes,
    and which a sandboxed workload cannot."""

    def prepare_code_environment(self) -> None:
        for path in (os.environ.get(SOURCE_ROOT), os.getcwd()):
            if path and path not in sys.path:
                sys.path.insert(0, path)


class GpupoolStepOperator(BaseStepOperator):  # type: ignore[misc]
    @property
    def config(self) -> GpupoolStepOperatorConfig:
        return cast(GpupoolStepOperatorConfig, self._config)

    @property
    def settings_class(self) -> type[BaseSettings] | None:
        return GpupoolStepOperatorSettings

    @property
    def entrypoint_config_class(self) -> type[StepOperatorEntrypointConfiguration]:
        return GpupoolEntrypointConfiguration

    def submit(self, info: StepRunInfo, entrypoint_command: list[str], environment: dict[str, str]) -> None:
        s = cast(GpupoolStepOperatorSettings, self.get_settings(info))
        project = s.project or contexts.setting(contexts.load(), "project")[0]
        if not project:
            raise ValueError("the gpupool step operator needs a project: its `project` setting, or GPUPOOL_PROJECT")
        with self._client() as client:
            code = None
            if s.upload_code:
                sent = upload_tree(client, source_utils.get_source_root(), project)
                code = sent.code if sent.files else None
            body = self._workload(info, s, project, code, entrypoint_command, environment)
            # Keyed by the step run: a submit tried again makes no second workload.
            w = client.submit(body, idempotency_key=f"zenml:{info.step_run_id}")
        metadata = {WORKLOAD: f"{w.project}/{w.name}", "gpupool_workload_id": w.id}
        publish_step_run_metadata(step_run_id=info.step_run_id, step_run_metadata={self.id: metadata})
        info.step_run.run_metadata.update(metadata)
        log.info(
            "Step `%s` runs as gpupool workload %s/%s (%s).", info.pipeline_step_name, w.project, w.name, w.gpu_request
        )

    def _workload(
        self,
        info: StepRunInfo,
        s: GpupoolStepOperatorSettings,
        project: str,
        code: str | None,
        command: list[str],
        environment: dict[str, str],
    ) -> WorkloadCreate:
        argv = list(command)
        if argv[:1] == ["python"]:
            argv[0] = s.python or sys.executable
        env = dict(environment) | {"ZENML_CONFIG_PATH": ".zenml"}  # its own, in its directory: never ~/.config
        if code is None:  # then it reads the step's code where the pipeline's process does (one host)
            env[SOURCE_ROOT] = source_utils.get_source_root()
        resources = info.config.resource_settings
        gpus = s.gpus if s.gpus is not None else (resources.gpu_count if s.gpu is None else None)
        fields: dict[str, Any] = {
            "project": project, "name": _name(info), "type": s.type, "gpu": s.gpu, "gpus": gpus,
            "gpu_memory": s.gpu_memory, "cpu": s.cpu or resources.cpu_count, "memory": s.memory, "pools": s.pools,
            "gpu_models": s.gpu_models, "priority": s.priority, "preemptible": s.preemptible, "image": s.image,
            "code": code, "command": argv, "env": env | s.env,
        }  # fmt: skip
        return WorkloadCreate.model_validate(fields)

    def get_status(self, step_run: StepRunResponse) -> ExecutionStatus:
        ref = step_run.run_metadata.get(WORKLOAD)
        if not ref:
            return ExecutionStatus.FAILED
        project, name = str(ref).split("/", 1)
        with self._client() as client:
            try:
                state = str(client.describe(name, project).state)
            except ApiError as e:
                if e.status == 404:  # removed: it ran, and nobody can say how it ended
                    return ExecutionStatus.FAILED
                raise
        return STATUS.get(state, ExecutionStatus.QUEUED)

    def wait(self, step_run: StepRunResponse) -> ExecutionStatus:
        """Polled at the component's pace (ZenML's own backs off to 16 s, longer than most steps' start)."""
        while True:
            status = self.get_status(step_run)
            if status.is_finished:
                return status
            time.sleep(self.config.poll_s)

    def cancel(self, step_run: StepRunResponse) -> None:
        ref = step_run.run_metadata.get(WORKLOAD)
        if ref:
            project, name = str(ref).split("/", 1)
            with self._client() as client:
                client.cancel(name, project)

    def _client(self) -> Client:
        cfg = contexts.load()
        url = self.config.url or contexts.setting(cfg, "url")[0] or contexts.DEFAULT_URL
        token = self.config.token or contexts.setting(cfg, "token")[0]
        if not token:
            raise ValueError("the gpupool step operator needs a token: `gpupool login`, GPUPOOL_TOKEN or its `token`")
        return Client(url, token)


def _name(info: StepRunInfo) -> str:
    """`zenml-<step>-<step run>`, DNS-safe: a retry is a new step run, so a new name."""
    step = re.sub(r"[^a-z0-9-]+", "-", info.pipeline_step_name.lower()).strip("-")[:40].strip("-") or "step"
    return f"zenml-{step}-{str(info.step_run_id)[:8]}"
