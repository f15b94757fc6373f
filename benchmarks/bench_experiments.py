#!/usr/bin/env python3
"""Time of the whole experiment set (issue 11): ``snsim experiment all`` as one
process with the default workers, cold (an empty output folder, so no cached
point), then each experiment's share from its own report line, and every
max-depth search's time.  Each figure beside its target; prints only.

Then ``snsim experiment max-depth`` again into the same folder (warm: every
probe is in the cache, so none may be planned), and with ``--alone`` each
policy's ``snsim search max-depth --no-cache`` on its own (no other search
beside it on the second core).

Targets: all figures together at most 120 s on the 2-core machine; one
policy's max-depth search at most 20 s; a repeated max-depth plans 0 probes.
The machine's load average is printed with the figures (the 2-core machine is
shared: a loaded run is slower).

    python benchmarks/bench_experiments.py [--out DIR] [--quick] [--workers 2] [--alone]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="output folder (default: a fresh temporary one)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--alone", action="store_true",
                    help="also time each policy's max-depth search on its own, uncached")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="snsim-bench-exp-"))
    argv = [sys.executable, "-m", "snsim.cli", "experiment", "all", "--out", str(out),
            "--workers", str(args.workers), "--no-progress"] + (["--quick"] if args.quick else [])
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    wall = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"snsim experiment all failed ({proc.returncode}):\n{proc.stderr}")
    print(proc.stdout)
    print(f"load average before {load0:.1f}, after {os.getloadavg()[0]:.1f} (2 cores)")
    for m in re.finditer(r"^(\S+): (\d+) rows in ([\d.]+) s", proc.stdout, re.M):
        print(f"  {m.group(1):<16} {float(m.group(3)):7.1f} s  ({m.group(2)} rows)")
    target = 120.0
    print(f"all experiments{' --quick' if args.quick else ''}, one process, "
          f"{args.workers} workers: {wall:.1f} s (target <= {target:.0f} s: "
          f"{'met' if wall <= target else 'MISSED'})")
    depth = out / "max-depth.csv"
    if depth.exists():
        import pandas as pd

        t = pd.read_csv(depth)
        for r in t.itertuples():
            print(f"  max-depth search {r.policy:<17} {r.search_s:6.1f} s (target <= 20 s: "
                  f"{'met' if r.search_s <= 20 else 'MISSED'}), {r.probes} probes")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if depth.exists():
        t0 = time.perf_counter()
        proc = subprocess.run(argv[:4] + ["max-depth"] + argv[5:], cwd=ROOT, capture_output=True,
                              text=True, env=env)
        warm = time.perf_counter() - t0
        if proc.returncode:
            sys.exit(f"warm max-depth failed ({proc.returncode}):\n{proc.stderr}")
        t = pd.read_csv(depth)
        planned = int(t.planned.sum())
        print(f"max-depth again (warm cache): {warm:.1f} s, {planned} probes planned "
              f"(target 0: {'met' if planned == 0 else 'MISSED'})")
    if args.alone:
        from snsim import policies

        for name in policies.names():
            cmd = [sys.executable, "-m", "snsim.cli", "search", "max-depth", "--policy", name,
                   "--json", "--no-cache", "--no-progress"] + \
                (["--budget", "6GiB"] if args.quick else [])
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
            dt = time.perf_counter() - t0
            d = __import__("json").loads(proc.stdout) if proc.returncode == 0 else {}
            print(f"  search max-depth alone {name:<17} {dt:6.1f} s (target <= 20 s: "
                  f"{'met' if dt <= 20 else 'MISSED'}), depth {d.get('depth')}, "
                  f"{d.get('probes')} probes, load {os.getloadavg()[0]:.1f}", flush=True)
    print(f"outputs in {out}")


if __name__ == "__main__":
    main()
