"""Durations as the CLI reads and prints them: one parser and one formatter for every command."""

from __future__ import annotations

import pytest

from gpupool.cli.submit import PRIORITIES
from gpupool.core.priority import DEFAULT_CLASSES
from gpupool.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30m", 1800), ("3d", 259200), ("1h30m", 5400), ("90s", 90), ("90", 90), ("1.5h", 5400), ("1d12h", 129600),
     (" 2H ", 7200), ("0", 0), ("1d2h3m4s", 93784)],
)  # fmt: skip
def test_people_write_durations_with_units_or_as_plain_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "why"),
    [("3x", "is not a duration"), ("", "is not a duration"), ("-5m", "is not a duration"), ("h", "is not a duration"),
     ("30m1h", "largest first"), ("1h1h", "largest first"), ("1 h", "is not a duration")],
)  # fmt: skip
def test_anything_else_is_refused_saying_what_is_expected(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(259200, "3d"), (5400, "1h30m"), (90, "1m30s"), (59, "59s"), (0, "0s"), (93784, "1d2h"), (86460, "1d"),
     (3600, "1h"), (7300, "2h1m"), (0.25, "0s"), (-3, "0s")],
)  # fmt: skip
def test_durations_print_in_at_most_two_units_never_as_raw_seconds(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_what_is_printed_reads_back_as_at_most_what_it_was() -> None:
    for seconds in (1, 59, 61, 3599, 3601, 86399, 86401, 30 * 86400):
        assert parse_duration(format_duration(seconds)) <= seconds


def test_minutes_are_the_smallest_unit_where_asked() -> None:
    assert (format_duration(3599.5, smallest="m"), format_duration(45, smallest="m")) == ("59m", "0m")


def test_the_clis_priority_choices_are_the_servers_classes() -> None:
    assert tuple(c.name for c in DEFAULT_CLASSES) == PRIORITIES
