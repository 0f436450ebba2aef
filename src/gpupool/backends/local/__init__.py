"""The local backend: this host's GPUs (NVML, or simulated), workloads as process groups."""

from gpupool.backends.local.backend import LocalBackend
from gpupool.backends.local.gpus import GpuSpecError, discover, parse_fake

__all__ = ["GpuSpecError", "LocalBackend", "discover", "parse_fake"]
