"""Durations as people write and read them: `30m`, `1h30m`, `3d`, `90s` or plain seconds in; `3d`, `1h30m` out.

Every CLI command that takes or shows a duration, and every sentence the server renders with one (events,
reasons), goes through this module, so `--max-duration 3d` is printed back as `3d`, never as `259200s`."""

from __future__ import annotations

import re

_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
_SECONDS = dict(_UNITS)
_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms])")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?[dhms])+")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
EXAMPLES = "30m, 1h30m, 3d, 90s or seconds"


def parse_duration(text: str) -> float:
    """Seconds in `text`: a plain number of seconds, or amounts with units d, h, m, s, largest first
    (`1d12h`, `1h30m`, `1.5h`). ValueError, saying what is expected, for anything else."""
    t = text.strip().lower()
    if _NUMBER.fullmatch(t):
        return float(t)
    if not _WHOLE.fullmatch(t):
        raise ValueError(f"{text!r} is not a duration (like {EXAMPLES})")
    parts = _PART.findall(t)
    units = [u for _, u in parts]
    # "30m1h" or "1h1h" is more likely a typo than a sum the writer meant.
    if units != sorted(set(units), key=lambda u: -_SECONDS[u]) or len(set(units)) != len(units):
        raise ValueError(f"{text!r} is not a duration: give each unit once, largest first (like 1h30m)")
    return sum(float(n) * _SECONDS[u] for n, u in parts)


def format_duration(seconds: float, parts: int = 2, smallest: str = "s") -> str:
    """`259200` -> `3d`, `5400` -> `1h30m`, `93784` -> `1d2h`: at most `parts` adjacent units from the largest
    that is not zero, rounded down, zeros left out; nothing under `smallest` (`s` or `m`)."""
    left = max(0, int(seconds))
    units = [(u, size) for u, size in _UNITS if size >= _SECONDS[smallest]]
    out: list[str] = []
    taken = 0
    for unit, size in units:
        amount, left = divmod(left, size)
        if out or amount:
            taken += 1
            if amount:
                out.append(f"{amount}{unit}")
        if taken == parts:
            break
    return "".join(out) or f"0{smallest}"


def format_optional(seconds: float | None) -> str:
    return "-" if seconds is None else format_duration(seconds)


def duration_flag(value: str | float) -> float:
    """A duration option's parser (typer.Option(parser=...)): a ValueError is Click's usage error, one line."""
    return float(value) if isinstance(value, (int, float)) else parse_duration(value)
