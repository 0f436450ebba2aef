"""Sizes as people write them (`16GB`, `16GiB`, `512Mi`), read as what they say: a decimal unit is a power of
1000 (GB = 10^9 bytes, as disks and Kubernetes' `G` count) and a binary one a power of 1024 (GiB = 2^30, `Gi`).

One reader for the server (host and GPU memory, volume sizes) and the CLI (which checks a flag before it uploads
anything), so `--memory 16GB` means the same everywhere: 16 * 10^9 bytes, 15,259 MiB, not 16 GiB."""

from __future__ import annotations

import math
import re
from fractions import Fraction

_SIZE = re.compile(r"\s*([0-9]{1,15}(?:\.[0-9]{1,15})?)\s*([A-Za-z]*)\s*", re.ASCII)
_MIB = 2**20
_PREFIXES = "KMGTP"
UNITS: dict[str, int] = {
    "b": 1,
    **{f"{p}b".lower(): 1000 ** (i + 1) for i, p in enumerate(_PREFIXES)},
    **{p.lower(): 1000 ** (i + 1) for i, p in enumerate(_PREFIXES)},
    **{f"{p}ib".lower(): 1024 ** (i + 1) for i, p in enumerate(_PREFIXES)},
    **{f"{p}i".lower(): 1024 ** (i + 1) for i, p in enumerate(_PREFIXES)},
}
"""Bytes per unit, by the unit in lower case (`16gb` is 16GB): B; KB, MB, GB, TB, PB and Kubernetes' K, M, G, T, P
(powers of 1000); KiB ... PiB and Ki ... Pi (powers of 1024)."""
MAX_MIB = 2**40
"""An exbibyte: more than any device or host, and far inside the store's 64-bit columns."""
HELP = "GB = 10^9 bytes, GiB = 2^30; also MB, MiB, TB, TiB and Kubernetes' G, Gi; a bare number is MiB"
"""The units in a flag's --help."""


def parse_mib(text: str) -> int:
    """MiB in `text`, rounded up (a request for 16GB gets at least 16 * 10^9 bytes); a bare number is MiB, as it
    always was here. ValueError, saying what is expected, for anything else."""
    m = _SIZE.fullmatch(text)
    if not m:
        raise ValueError(f"{text[:40]!r}: expected a size like 20GiB or 512MiB ({HELP})")
    number, unit = m.group(1), m.group(2)
    per = UNITS.get(unit.lower()) if unit else _MIB
    if per is None:
        raise ValueError(f"{text[:40]!r}: unknown unit {unit[:12]!r}; {HELP}")
    mib = math.ceil(Fraction(number) * per / _MIB)
    if mib < 1:
        raise ValueError(f"{text!r} is less than 1 MiB")
    if mib > MAX_MIB:
        raise ValueError(f"{text!r} is more than 1 EiB")
    return mib


def size_flag(value: str) -> str:
    """A size option's parser (typer.Option(parser=...)): the text as given, once it reads as a size; a
    ValueError is Click's usage error (exit 2), before anything is uploaded."""
    parse_mib(value)
    return value
