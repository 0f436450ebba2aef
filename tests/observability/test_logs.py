"""The server's log lines: JSON objects or text, and a cycle's id on every line logged during it, in its own
thread and in the threads that launch its workloads."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from gpupool.backends.base import LaunchSpec
from gpupool.control.controller import Controller
from gpupool.logs import configure_logging, cycle_context

log = logging.getLogger("gpupool.test")


@pytest.fixture
def out() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    level = root.level
    stream = io.StringIO()
    handler = configure_logging("json", "info", stream)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_the_cycle_id_and_the_fields_passed(out: io.StringIO) -> None:
    log.info("outside")
    with cycle_context(7):
        log.info("bind %s", "p/w", extra={"event": "bind", "workload_id": 3, "nodes": ["n1"]})
    log.debug("not at info")
    first, second = _lines(out)
    assert {k: first[k] for k in ("level", "logger", "message")} == {
        "level": "INFO", "logger": "gpupool.test", "message": "outside"
    }  # fmt: skip
    assert "cycle_id" not in first and str(first["time"]).endswith("+00:00")
    assert {k: second[k] for k in ("message", "cycle_id", "event", "workload_id", "nodes")} == {
        "message": "bind p/w", "cycle_id": 7, "event": "bind", "workload_id": 3, "nodes": ["n1"],
    }  # fmt: skip


def test_text_lines_end_with_their_cycle(out: io.StringIO) -> None:
    stream = io.StringIO()
    handler = configure_logging("text", "warning", stream)  # replaces the fixture's handler
    assert [h for h in logging.getLogger().handlers if getattr(h, "gpupool", False)] == [handler]
    with cycle_context(12):
        log.warning("launching %s failed", "4-0-0")
    log.info("quiet")
    assert stream.getvalue().rstrip("\n").split(" ", 2)[2] == "WARNING gpupool.test: launching 4-0-0 failed [cycle 12]"
    assert out.getvalue() == ""
    logging.getLogger().removeHandler(handler)


def test_launches_in_the_pool_log_under_their_cycle(out: io.StringIO) -> None:
    controller = Controller(None, None)  # type: ignore[arg-type]  # only its launcher is used

    def launch(spec: LaunchSpec) -> None:
        log.info("launched %s", spec.alloc_id)

    specs = [LaunchSpec(f"{i}-0-0", i, f"w{i}", "p", "training", ("true",), {}) for i in range(3)]
    with cycle_context(5):
        assert controller._launch_all(launch, specs) == [None, None, None]
    assert sorted((line["message"], line["cycle_id"]) for line in _lines(out)) == [
        ("launched 0-0-0", 5), ("launched 1-0-0", 5), ("launched 2-0-0", 5)
    ]  # fmt: skip


def test_an_unknown_format_or_level_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown log format 'xml'; choose one of: text, json"):
        configure_logging("xml", "info")
    with pytest.raises(ValueError, match="unknown log level 'loud'; choose one of: debug, info, warning, error"):
        configure_logging("json", "loud")
