"""Tables that fit the terminal: a column is dropped, lowest value first, before any name is cut."""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

# Rich's default box: each column is its text plus one space either side and a rule; one more rule closes the row.
_PER_COLUMN = 3
_WRAP_WIDTH = 24
"""The room a wrapping column gets before others are left out: a reason in a few lines, not a word a line."""


@dataclass(frozen=True)
class Column:
    header: str
    drop: int = 0
    """Columns go from the highest `drop` down while the table is too wide; 0: never dropped."""
    wrap: bool = False
    """Words may wrap onto further lines (a reason); any other column's cells are always shown whole."""


def terminal_width() -> int:
    """$COLUMNS where set (as shutil reads it), else the terminal's, else 80."""
    return shutil.get_terminal_size().columns


def _need(column: Column, cells: Iterable[str]) -> int:
    texts = [column.header, *cells]
    whole = max(cell_len(text) for text in texts)
    if column.wrap:
        return max(min(whole, _WRAP_WIDTH), *(cell_len(word) for text in texts for word in text.split()))
    return whole


def fitted(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> Table:
    """A table of the columns worth most that fit `width` with every unwrapped cell whole."""
    need = [_need(col, (row[i] for row in rows)) for i, col in enumerate(columns)]
    keep = list(range(len(columns)))
    for i in sorted((i for i, col in enumerate(columns) if col.drop), key=lambda i: -columns[i].drop):
        if sum(need[k] + _PER_COLUMN for k in keep) + 1 <= width:
            break
        keep.remove(i)
    table = Table()
    for k in keep:
        col = columns[k]
        table.add_column(col.header, no_wrap=not col.wrap, min_width=need[k], overflow="fold")
    for row in rows:
        table.add_row(*(row[k] for k in keep))
    return table


def print_fitted(columns: Sequence[Column], rows: Sequence[Sequence[str]], console: Console | None = None) -> None:
    width = terminal_width()
    (console or Console(width=width)).print(fitted(columns, rows, width))
