"""The hardening sweep: hundreds of careless and hostile uses of `harness`, each judged by
the product's promises (benchmarks/sweep/core.py: the documented exit code, one `error:` line
naming the problem, no traceback, nothing left running or behind, and the case's own check).

    python benchmarks/hardening_sweep.py [--family NAME ...] [--jobs 2] [--out DIR] [--list]

Families are the modules of benchmarks/sweep/ (all but core), each with `cases()`. Cases run
two at a time (a case marked solo runs alone, after the others). Writes `sweep.json` under
`--out` (each failure with what went wrong; the work folders of failed cases are kept there)
and exits 1 when any case failed, 0 when every case held.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep.core import Case, Tally, run_case  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def families() -> list[str]:
    return sorted(p.stem for p in (ROOT / "benchmarks" / "sweep").glob("*.py")
                  if p.stem not in ("core", "__init__") and not p.stem.startswith("_"))


def collect(names: list[str]) -> list[Case]:
    cases: list[Case] = []
    for name in names:
        cases += importlib.import_module(f"sweep.{name}").cases()
    keys = [c.key for c in cases]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise SystemExit(f"hardening_sweep: case names repeated: {', '.join(dup[:5])}")
    return cases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", action="append", choices=families())
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "hardening-sweep")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--only", help="run the cases whose family/name contains this text")
    a = ap.parse_args(argv)
    cases = collect(a.family or families())
    if a.only:
        cases = [c for c in cases if a.only in c.key]
    if a.list:
        for c in cases:
            print(c.key)
        print(f"{len(cases)} cases")
        return 0
    shutil.rmtree(a.out, ignore_errors=True)
    a.out.mkdir(parents=True)
    tally = Tally()
    t0 = time.monotonic()
    done = 0

    def one(case: Case) -> None:
        nonlocal done
        problems = run_case(case, a.out / "work")
        tally.add(case, problems)
        done += 1
        mark = "ok  " if not problems else "FAIL"
        print(f"[{done}/{len(cases)}] {mark} {case.key}"
              + ("" if not problems else f": {'; '.join(problems)}"), flush=True)

    with ThreadPoolExecutor(max(1, a.jobs)) as pool:
        list(pool.map(one, [c for c in cases if not c.solo]))
    for c in cases:
        if c.solo:
            one(c)
    held = sum(tally.held.values())
    failed = sum(len(v) for v in tally.failed.values())
    print(f"\n{held + failed} cases in {time.monotonic() - t0:.0f} s: {held} held, "
          f"{failed} failed")
    for fam in sorted(tally.held):
        n_failed = len(tally.failed[fam])
        print(f"  {fam}: {tally.held[fam]} held" + (f", {n_failed} failed" if n_failed else ""))
    (a.out / "sweep.json").write_text(json.dumps(
        {"cases": held + failed, "held": held, "failed": failed,
         "families": {f: {"held": tally.held[f], "failed": dict(tally.failed[f])}
                      for f in sorted(tally.held)}}, indent=1) + "\n")
    if failed == 0:
        shutil.rmtree(a.out / "work", ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
