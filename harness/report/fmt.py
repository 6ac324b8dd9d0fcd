"""Number formatting and HTML tables for reports (cells are HTML the caller has escaped)."""

from __future__ import annotations

import math
from typing import Any


def fmt(value: Any, digits: int = 4) -> str:
    """A short readable number: '-' for None/NaN, ints with separators, floats to 4 digits."""
    if value is None or isinstance(value, bool):
        return "-" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if value != 0 and abs(value) >= 10 ** digits:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    return str(value)


def fmt_bytes(n: Any) -> str:
    """Bytes as B / KiB / MiB / GiB."""
    if n is None:
        return "-"
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(x) < 1024 or unit == "GiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.4g} {unit}"
        x /= 1024
    return f"{x:.4g} TiB"  # pragma: no cover


def table(heads: list[str], rows: list[list[str]], text_cols: int = 1) -> str:
    """An HTML table; heads and cells are trusted HTML; the first text_cols align left."""

    def cls(i: int) -> str:
        return " class='t'" if i < text_cols else ""

    head = "".join(f"<th{cls(i)}>{h}</th>" for i, h in enumerate(heads))
    body = "".join("<tr>" + "".join(f"<td{cls(i)}>{c}</td>" for i, c in enumerate(row))
                   + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
