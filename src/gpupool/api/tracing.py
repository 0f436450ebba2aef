"""Optional OpenTelemetry traces: a span per API request (OpenTelemetry's FastAPI instrumentation) and a span per
scheduling cycle (`gpupool.cycle`, which the controller opens through OpenTelemetry's API, a no-op until a
provider is set here).

Off unless asked for, with GPUPOOL_OTEL=1 or the standard OTEL_EXPORTER_OTLP_ENDPOINT, and installed
(`gpupool[otel]`); spans then go by OTLP over HTTP wherever the standard OTEL_* variables say. Never a hard
dependency: without the packages, asking for traces logs one warning and the server runs without them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from fastapi import FastAPI

from gpupool import __version__

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger("gpupool.api")

SWITCH = "GPUPOOL_OTEL"
_ON = ("1", "true", "yes", "on")


def wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for traces."""
    env = os.environ if env is None else env
    return env.get(SWITCH, "").strip().lower() in _ON or bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip())


def setup_tracing(app: FastAPI, exporter: SpanExporter | None = None, env: Mapping[str, str] | None = None) -> bool:
    """Traces `app`'s requests and the scheduler's cycles when the environment asks (or an `exporter` is given,
    which then receives every span as it ends). Returns whether tracing is on."""
    if exporter is None and not wanted(env):
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError:
        log.warning("traces were asked for (%s or OTEL_EXPORTER_OTLP_ENDPOINT), but OpenTelemetry is not "
                    "installed: pip install 'gpupool[otel]'; running without them", SWITCH)  # fmt: skip
        return False
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        # A process has one global provider (the controller's cycles find it there); set once, then reused.
        name = (os.environ if env is None else env).get("OTEL_SERVICE_NAME", "gpupool")
        provider = TracerProvider(resource=Resource.create({"service.name": name, "service.version": __version__}))
        trace.set_tracer_provider(provider)
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    FastAPIInstrumentor.instrument_app(app, tracer_provider=provider, excluded_urls="healthz")
    return True
