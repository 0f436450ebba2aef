"""The flavor's settings (per step, over the component's) and configuration, without the operator itself, which
ZenML imports only where a step runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field
from zenml.config.base_settings import BaseSettings
from zenml.step_operators import BaseStepOperatorConfig, BaseStepOperatorFlavor
from zenml.utils.secret_utils import SecretField

if TYPE_CHECKING:
    from gpupool.integrations.zenml.step_operator import GpupoolStepOperator


class GpupoolStepOperatorSettings(BaseSettings):  # type: ignore[misc]
    """What a step asks of gpupool: `@step(step_operator=True, settings={"step_operator":
    GpupoolStepOperatorSettings(gpu=0.25)})`. Unset fields come from the component's configuration, and GPUs and
    CPUs from the step's own ResourceSettings where neither names them."""

    project: str | None = Field(None, description="The project it runs in (default: the CLI's, GPUPOOL_PROJECT).")
    gpu: float | None = Field(None, gt=0, lt=1, description="A fraction of one GPU.")
    gpus: int | None = Field(None, ge=0, description="Whole GPUs (default: ResourceSettings.gpu_count).")
    gpu_memory: str | None = None
    cpu: float | None = Field(None, gt=0)
    memory: str | None = None
    type: str = Field("training", description="training or batch: its priority class and preemptibility.")
    priority: str | None = None
    preemptible: bool | None = None
    pools: list[str] = Field(default_factory=list)
    gpu_models: list[str] = Field(default_factory=list)
    image: str | None = Field(None, description="A container image to run the step in (it needs ZenML in it).")
    python: str | None = Field(
        None, description="The interpreter that runs the step (default: the one running the pipeline, which has "
        "ZenML and gpupool); `python` runs the step's own environment, built from the code's requirements.txt.",
    )  # fmt: skip
    upload_code: bool = Field(True, description="Send the source root as the workload's code (else none).")
    env: dict[str, str] = Field(default_factory=dict, description="More environment variables for the step.")


class GpupoolStepOperatorConfig(BaseStepOperatorConfig, GpupoolStepOperatorSettings):  # type: ignore[misc]
    url: str | None = Field(None, description="gpupool's address (default: the CLI's, GPUPOOL_URL).")
    token: str | None = SecretField(default=None)
    """A gpupool token (default: the CLI's, GPUPOOL_TOKEN); a secret in ZenML's store."""
    poll_s: float = Field(1.0, gt=0, le=60, description="How often a submitted step's workload is looked at.")

    @property
    def is_remote(self) -> bool:
        """Not remote to ZenML: a step reaches the store and artifact store the pipeline names, which on a
        single-user server may be local ones. With a multi-tenant server, name remote ones (see docs/zenml.md)."""
        return False


class GpupoolStepOperatorFlavor(BaseStepOperatorFlavor):  # type: ignore[misc]
    @property
    def name(self) -> str:
        return "gpupool"

    @property
    def config_class(self) -> type[GpupoolStepOperatorConfig]:
        return GpupoolStepOperatorConfig

    @property
    def implementation_class(self) -> type[GpupoolStepOperator]:
        from gpupool.integrations.zenml.step_operator import GpupoolStepOperator

        return GpupoolStepOperator
