"""ZenML's step operator flavor `gpupool` (`pip install gpupool[zenml]`): each step a pipeline gives it runs as a
gpupool workload, with the step's GPU request, code, image and environment, under its project's quota.

    zenml step-operator flavor register gpupool.integrations.zenml.GpupoolStepOperatorFlavor
    zenml step-operator register gpupool --flavor=gpupool --project=vision
"""

from gpupool.integrations.zenml.flavor import (
    GpupoolStepOperatorConfig,
    GpupoolStepOperatorFlavor,
    GpupoolStepOperatorSettings,
)

__all__ = ["GpupoolStepOperatorConfig", "GpupoolStepOperatorFlavor", "GpupoolStepOperatorSettings"]
