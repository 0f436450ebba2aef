"""gpupool: a self-service internal GPU cloud."""

__version__ = "0.1.0"
