"""Execution backends behind one small interface (gpupool.backends.base)."""
