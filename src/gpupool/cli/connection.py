"""Where the CLI finds the server (GPUPOOL_URL and GPUPOOL_TOKEN, else the selected context of the settings file,
gpupool.cli.contexts) and how it prints."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Any, NoReturn

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from gpupool.cli import contexts
from gpupool.client import Client


class Output(StrEnum):
    table = "table"
    json = "json"


OutputOpt = typer.Option(Output.table, "-o", "--output", help="table, or json for scripts.")


def client() -> Client:
    cfg = contexts.load()
    name = cfg.selected()
    if name not in cfg.contexts and (contexts.chosen or os.environ.get(contexts.CONTEXT_ENV)):
        fail(f"no context {name!r}" + (f" (contexts: {', '.join(sorted(cfg.contexts))})" if cfg.contexts else ""), 2)
    url, _ = contexts.setting(cfg, "url")
    token, _ = contexts.setting(cfg, "token")
    if not token:
        fail("not logged in: run `gpupool login --url URL --token TOKEN`, or set GPUPOOL_URL and GPUPOOL_TOKEN")
    return Client(url or contexts.DEFAULT_URL, token)


def default_project() -> str | None:
    """-p's default: $GPUPOOL_PROJECT, else the selected context's project (`gpupool config set project NAME`)."""
    return contexts.setting(contexts.load(), "project")[0]


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
