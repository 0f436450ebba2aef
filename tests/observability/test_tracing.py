"""Optional traces: off unless the environment asks; when on, a span per API request and one per scheduling
cycle, caught here by OpenTelemetry's in-memory exporter."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.api.tracing import setup_tracing, wanted
from tests.observability.harness import cluster


def test_only_the_switch_or_an_endpoint_turns_traces_on() -> None:
    assert [wanted({}), wanted({"GPUPOOL_OTEL": "0"}), wanted({"GPUPOOL_OTEL": "1"})] == [False, False, True]
    assert wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}) is True


def test_requests_and_cycles_are_spans(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    with cluster(tmp_path) as c:
        assert setup_tracing(c.api.app, env={}) is False
        spans = InMemorySpanExporter()
        assert setup_tracing(c.api.app, exporter=spans) is True
        assert c.http("GET", "/api/v1/whoami").status_code == 200
        c.cycle()
        c.cycle()
    finished = spans.get_finished_spans()
    server = [s for s in finished if s.kind.name == "SERVER"]
    assert [(s.name, s.attributes["http.route"], s.attributes["http.status_code"]) for s in server] == [
        ("GET /api/v1/whoami", "/api/v1/whoami", 200)
    ]
    cycles = [s for s in finished if s.name == "gpupool.cycle"]
    assert [s.attributes["gpupool.cycle_id"] for s in cycles] == [1, 2]
    assert {s.resource.attributes["service.name"] for s in (*server, *cycles)} == {"gpupool"}
