"""Where the CLI finds the server: GPUPOOL_URL and GPUPOOL_TOKEN, else what `gpupool login` saved."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any, NoReturn

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from gpupool.client import Client

DEFAULT_URL = "http://127.0.0.1:8470"


class Output(StrEnum):
    table = "table"
    json = "json"


OutputOpt = typer.Option(Output.table, "-o", "--output", help="table, or json for scripts.")


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpupool" / "config.json"


def load_config() -> dict[str, Any]:
    try:
        data = json.loads(config_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_config(data: dict[str, Any]) -> Path:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
    return path


def client() -> Client:
    cfg = load_config()
    url = os.environ.get("GPUPOOL_URL") or cfg.get("url") or DEFAULT_URL
    token = os.environ.get("GPUPOOL_TOKEN") or cfg.get("token")
    if not token:
        fail("not logged in: run `gpupool login --url URL --token TOKEN`, or set GPUPOOL_URL and GPUPOOL_TOKEN")
    return Client(url, token)


def fail(message: str, code: int = 1) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def emit_json(data: BaseModel | Sequence[BaseModel] | dict[str, Any]) -> None:
    if isinstance(data, BaseModel):
        out: Any = data.model_dump(mode="json")
    elif isinstance(data, (list, tuple)):
        out = [d.model_dump(mode="json") for d in data]
    else:
        out = data
    print(json.dumps(out, indent=2))


def print_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """One Rich table: the CLI's every human-readable list."""
    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    Console().print(table)
