"""Small text helpers every layer shares: byte counts for people."""
from __future__ import annotations


def format_bytes(n: float) -> str:
    """``1.5 GiB``: three significant digits in the largest binary unit that fits."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def describe_bytes(n: int) -> str:
    """``1,610,612,736 bytes (1.5 GiB)``: the exact count, then the unit (GiB at most)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n:,} bytes ({n / size:.4g} {unit})"
    return f"{n:,} bytes"
