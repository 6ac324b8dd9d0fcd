"""How the importer cases are judged beyond the common rules: what the import wrote (rows,
warnings, provenance counts) and, for inputs built to exhaust memory, the command's peak RSS."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from sweep.core import HARNESS, Case, Result, judge

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
    """`case` run by a driver that also reads the command's peak memory (wait4's rusage)."""
    def driver(work: Path, env: dict[str, str]) -> str | None:
        t0 = time.monotonic()
        with open(work / ".stdout", "wb") as out, open(work / ".stderr", "wb") as err:
            proc = subprocess.Popen([HARNESS, *case.argv], cwd=work, env=env, stdout=out,
                                    stderr=err, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                if time.monotonic() - t0 > case.timeout_s:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    return f"still running after {case.timeout_s:g} s"
                time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)
        res = Result(proc.returncode, (work / ".stdout").read_text(errors="replace"),
                     (work / ".stderr").read_text(errors="replace"), work,
                     time.monotonic() - t0)
        (work / ".stdout").unlink()
        (work / ".stderr").unlink()
        problems = judge(case, res)
        if usage.ru_maxrss > MAX_RSS_KIB:
            problems.append(f"peak RSS {usage.ru_maxrss >> 10} MiB, over 1 GiB")
        try:
            os.killpg(proc.pid, 0)
            problems.append("processes of its session still running after it ended")
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return "; ".join(problems) or None
    return Case(case.family, case.name, case.argv, case.expect, case.must_say, case.check,
                driver=driver, setup=case.setup, timeout_s=case.timeout_s, solo=True)

