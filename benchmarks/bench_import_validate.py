"""Load + validate a ~1,000,000-step trajectory file; exit 1 if it takes longer than the limit.

Generation and writing are timed and reported separately; only `load_trajectories` (read the
Parquet file and check every rule) counts against the limit.

    .venv/bin/python benchmarks/bench_import_validate.py [--steps 1000000] [--limit 5]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

from harness.traces.generator import generate, provenance_for
from harness.traces.profiles import load_profile
from harness.traces.schema import write_trajectories
from harness.traces.validate import load_trajectories


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--profile", default="flaky-tools", help="generator profile (many short "
                                                             "trajectories by default)")
    ap.add_argument("--steps", type=int, default=1_000_000, help="target number of steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=float, default=5.0, help="seconds allowed for load+validate")
    ap.add_argument("--repeat", type=int, default=3, help="load+validate runs; the best counts")
    ap.add_argument("--out", type=Path, default=None, help="keep the file here (default: temp)")
    return ap.parse_args(argv)


def run(args: argparse.Namespace, workdir: Path) -> float:
    """Generate, write and time load+validate; return the best load+validate time."""
    prof = load_profile(args.profile)
    per_traj = len(generate(prof, 2000, args.seed + 1)) / 2000
    n = max(1, math.ceil(args.steps / per_traj))

    t0 = time.perf_counter()
    df = generate(prof, n, args.seed)
    t_gen = time.perf_counter() - t0
    path = args.out or workdir / "bench.parquet"
    t0 = time.perf_counter()
    write_trajectories(df, path, provenance_for(prof, n, args.seed))
    t_write = time.perf_counter() - t0
    rows = len(df)
    del df

    times = []
    for _ in range(max(1, args.repeat)):
        t0 = time.perf_counter()
        loaded = load_trajectories(path)
        times.append(time.perf_counter() - t0)
        assert len(loaded) == rows
        del loaded
    best = min(times)
    print(f"profile {args.profile}: {n} trajectories, {rows} steps, "
          f"{path.stat().st_size / 1e6:.1f} MB Parquet")
    print(f"generate        {t_gen:7.2f} s")
    print(f"write           {t_write:7.2f} s")
    print(f"load+validate   {best:7.2f} s best of {len(times)} "
          f"({', '.join(f'{t:.2f}' for t in times)}); {rows / best / 1e6:.2f} M steps/s")
    print(f"limit           {args.limit:7.2f} s: {'OK' if best <= args.limit else 'TOO SLOW'}")
    return best


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0 when load+validate is within the limit, else 1."""
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        best = run(args, Path(tmp))
    return 0 if best <= args.limit else 1


if __name__ == "__main__":
    sys.exit(main())
