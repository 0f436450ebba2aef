"""The server's logging: plain text for people, or JSON lines for a log pipeline; every line written during a
scheduling cycle carries that cycle's id, so one cycle's binds, stops and failures can be read together."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TextIO

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")

_cycle: ContextVar[int | None] = ContextVar("gpupool_cycle_id", default=None)

_QUIET = {"alembic": logging.WARNING, "httpx": logging.WARNING}
"""Libraries whose every step (a migration's, the app proxy's every request) is noise at INFO."""


def current_cycle() -> int | None:
    return _cycle.get()


@contextmanager
def cycle_context(cycle_id: int) -> Iterator[None]:
    """Lines logged inside (in this thread, or in work started with a copy of its context) carry `cycle_id`."""
    token = _cycle.set(cycle_id)
    try:
        yield
    finally:
        _cycle.reset(token)


class CycleFilter(logging.Filter):
    """Adds `cycle_id` to every record logged inside a cycle (a handler's filter, so libraries' lines get it too)."""

    def filter(self, record: logging.LogRecord) -> bool:
        cycle_id = _cycle.get()
        if cycle_id is not None and not hasattr(record, "cycle_id"):
            record.cycle_id = cycle_id
        return True


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message`, and ` [cycle N]` on a cycle's lines."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        cycle_id = getattr(record, "cycle_id", None)
        return line if cycle_id is None else f"{line} [cycle {cycle_id}]"


def json_formatter() -> logging.Formatter:
    """One JSON object a line: time (ISO 8601, UTC), level, logger, message, and every field the call passed in
    `extra` (cycle_id, workload_id, ...)."""
    from pythonjsonlogger.json import JsonFormatter

    return JsonFormatter(
        "%(levelname)s %(name)s %(message)s",
        rename_fields={"levelname": "level", "name": "logger"},
        timestamp="time",
    )


def configure_logging(fmt: str = "text", level: str = "info", stream: TextIO | None = None) -> logging.Handler:
    """Log at `level` through one root handler that writes `fmt` ("text" or "json") to `stream` (stderr by
    default); a second call replaces the first's handler, and handlers others added stay. Returns the handler.
    Raises ValueError, naming the choices, for a format or level it does not know."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    if level.lower() not in LEVELS:
        raise ValueError(f"unknown log level {level!r}; choose one of: {', '.join(LEVELS)}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(json_formatter() if fmt == "json" else TextFormatter())
    handler.addFilter(CycleFilter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "gpupool", False)]:
        root.removeHandler(old)
    handler.gpupool = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name, quiet in _QUIET.items():
        logging.getLogger(name).setLevel(quiet)
    return handler
