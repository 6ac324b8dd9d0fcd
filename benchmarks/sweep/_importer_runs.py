"""How the importer cases are judged beyond the common rules: what the import wrote (rows,
warnings, provenance counts) and, for inputs built to exhaust memory, the command's peak RSS."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from sweep.core import Case, Result

OUT = "out.parquet"
MAX_RSS_KIB = 1 << 20  # 1 GiB: a gzip bomb is refused long before it is held whole


def no_output(res: Result) -> str | None:
    return f"{OUT} was written on a refused import" if (res.work / OUT).exists() else None


def rows(n: int | None, *warnings: str) -> Callable[[Result], str | None]:
    """The import wrote OUT with `n` rows (None: any number) and warned of each of `warnings`."""
    def check(res: Result) -> str | None:
        import pyarrow.parquet as pq

        out = res.work / OUT
        if not out.is_file():
            return f"{OUT} was not written"
        rows = pq.read_metadata(out).num_rows
        if n is not None and rows != n:
            return f"{OUT} has {rows} rows, expected {n}"
        for w in warnings:
            if not any(w in ln for ln in res.stderr.splitlines() if ln.startswith("warning:")):
                return f"no warning about {w!r}"
        return None
    return check


def totals(key: str, n: int) -> Callable[[Result], str | None]:
    """OUT's provenance counts `n` of `key` in its totals."""
    def check(res: Result) -> str | None:
        from harness.traces.schema import read_provenance

        prov = read_provenance(res.work / OUT)
        got = None if prov is None else prov.extra.get("totals", {}).get(key)
        return None if got == n else f"provenance totals[{key!r}] is {got!r}, expected {n}"
    return check


def both(*checks: Callable[[Result], str | None]) -> Callable[[Result], str | None]:
    def check(res: Result) -> str | None:
        for c in checks:
            msg = c(res)
            if msg:
                return msg
        return None
    return check



def measured(case: Case) -> Case:
    """`case`, its command's peak memory bounded (MAX_RSS_KIB), run alone."""
    return dataclasses.replace(case, max_rss_kib=MAX_RSS_KIB, solo=True)
