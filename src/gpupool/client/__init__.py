"""A typed client for gpupool's API, used by the CLI, the tests and users' scripts."""

from gpupool.client.client import ApiError, Client

__all__ = ["ApiError", "Client"]
