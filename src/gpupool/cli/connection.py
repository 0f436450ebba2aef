"""Where the CLI finds the server (GPUPOOL_URL and GPUPOOL_TOKEN, else the selected context of the settings file,
gpupool.cli.contexts) and how it prints."""

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
    """One Rich table: the CLI's every human-readable list. Its first column (what each row is: a name, a user, a
    project/workload) is never cut short, however narrow the terminal: the other columns give way."""
    rows = [tuple(row) for row in rows]
    table = Table(title=title)
    for i, col in enumerate(columns):
        if i == 0:
            widest = max((len(str(row[0])) for row in rows if row), default=0)
            table.add_column(col, no_wrap=True, min_width=max(len(col), widest))
        else:
            table.add_column(col)
    for row in rows:
        table.add_row(*row)
    Console().print(table)


def read_mapping(file: Path, fields: str) -> dict[str, Any]:
    """A YAML file (- for stdin) holding a mapping; a clear message and exit 2 otherwise. `fields` names a few of
    the mapping's fields, for the message."""
    import yaml

    try:
        data = yaml.safe_load(file.read_text() if str(file) != "-" else sys.stdin.read())
    except OSError as e:
        fail(f"cannot read {file}: {e.strerror}", 2)
    except yaml.YAMLError as e:
        fail(f"{file} is not valid YAML: {str(e).splitlines()[0]}", 2)
    if not isinstance(data, dict):
        fail(f"{file}: expected a mapping of {fields}", 2)
    return data
