"""The HTTP API: FastAPI app factory, wire models (schemas), thin routers over gpupool.services."""
