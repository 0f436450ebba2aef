"""Sizes read as they are written: GB a power of 1000, GiB a power of 1024, Kubernetes' G and Gi alike; what is
not a size, or has a unit nobody writes, is refused with the units that are."""

from __future__ import annotations

import pytest

from gpupool.models.sizes import HELP, parse_mib


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("16GiB", 16384), ("16Gi", 16384), ("16gib", 16384), ("512MiB", 512), ("512Mi", 512), ("1TiB", 1024**2),
        # Decimal units, rounded up to whole MiB: 16 * 10^9 bytes is 15,258.79 MiB.
        ("16GB", 15259), ("16G", 15259), ("16gb", 15259), ("500MB", 477), ("500M", 477), ("1TB", 953675),
        ("0.5GiB", 512), ("1.5GB", 1431), (" 2 GiB ", 2048), ("2048", 2048), ("1KB", 1), ("1B", 1),
    ],
)  # fmt: skip
def test_decimal_and_binary_units_mean_what_they_say(text: str, mib: int) -> None:
    assert parse_mib(text) == mib


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("16XB", f"'16XB': unknown unit 'XB'; {HELP}"),
        ("16GiBs", f"'16GiBs': unknown unit 'GiBs'; {HELP}"),
        ("lots", f"'lots': expected a size like 20GiB or 512MiB ({HELP})"),
        ("-1GiB", f"'-1GiB': expected a size like 20GiB or 512MiB ({HELP})"),
        ("0GB", "'0GB' is less than 1 MiB"),
        ("999999999999GiB", "'999999999999GiB' is more than 1 EiB"),
    ],
)
def test_what_is_not_a_size_is_refused_with_the_units_that_are(text: str, reason: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_mib(text)
    assert str(e.value) == reason


def test_the_units_are_stated_once() -> None:
    assert HELP == "GB = 10^9 bytes, GiB = 2^30; also MB, MiB, TB, TiB and Kubernetes' G, Gi; a bare number is MiB"
