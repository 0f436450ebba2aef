"""Lists fit the terminal by leaving columns out, lowest value first, never by cutting a name."""

from __future__ import annotations

import io

import pytest
from rich.cells import cell_len
from rich.console import Console

from gpupool.cli.connection import print_table
from gpupool.cli.table import Column, fitted
from gpupool.cli.workloads import LIST_COLUMNS

LONG = "a-very-long-workload-name-of-sixty-three-characters-0123456789a"


def _render(columns: tuple[Column, ...], rows: list[tuple[str, ...]], width: int) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width).print(fitted(columns, rows, width))
    return out.getvalue().splitlines()


def _row(name: str) -> tuple[str, ...]:
    return (name, "vision", "ana", "training", "interactive", "pending", "0.25 GPU", "-",
            "over limit: vision 2+2/3 GPUs in default", "in 1d2h (declared)", "3m")  # fmt: skip


def test_at_80_columns_every_name_is_whole_and_no_line_is_wider() -> None:
    assert len(LONG) == 63
    lines = _render(LIST_COLUMNS, [_row(LONG), _row("nb-1")], 80)
    assert max(cell_len(line) for line in lines) <= 80
    assert sum(LONG in line for line in lines) == 1
    header = next(line for line in lines if "NAME" in line)
    assert [h for h in ("NAME", "STATE") if h in header] == ["NAME", "STATE"]


def test_columns_go_lowest_value_first() -> None:
    rows = [_row("train-resnet")]
    headers = [next(line for line in _render(LIST_COLUMNS, rows, width) if "NAME" in line) for width in (200, 80)]
    wide = [c.header for c in LIST_COLUMNS if c.header in headers[0]]
    narrow = [c.header for c in LIST_COLUMNS if f" {c.header} " in headers[1]]
    assert wide == [c.header for c in LIST_COLUMNS]
    assert narrow == ["NAME", "PROJECT", "STATE", "GPUS", "REASON", "AGE"]


def test_a_reason_wraps_at_its_words_rather_than_pushing_out_more_columns() -> None:
    lines = _render(LIST_COLUMNS, [_row("train-resnet")], 70)
    assert max(cell_len(line) for line in lines) <= 70
    assert sum("train-resnet" in line for line in lines) == 1
    assert any("over limit:" in line for line in lines) and any("default" in line for line in lines)


def test_a_reports_first_column_is_never_cut_however_narrow_the_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    columns = ("WORKLOAD", "RUNS", "GPU-HOURS", "BUSY", "IDLE", "COST", "ON-PREM", "BURST")
    print_table("usage by workload", columns, [("vision/a-rather-long-name", "2", "1.00", "0.00", "1.00", "0.00",
                                                "0.00", "0.00")])  # fmt: skip
    body = [line for line in capsys.readouterr().out.splitlines() if line.startswith("│")]
    assert len(body) == 1 and body[0].startswith("│ vision/a-rather-long-name │")
