#!/usr/bin/env python3
"""Whole-process speed a user feels: the README's commands, start to exit (issue 13).

Each command runs as its own process (``python -m snsim.cli ...``, output
discarded); the wall time is the median of ``--repeats`` runs, and the peak
RSS is the process's own (``os.wait4``).  Beside each figure: its target.
The processes run with bytecode caching on (``PYTHONDONTWRITEBYTECODE``
removed, one warm-up run first), as an installed snsim runs; without it every
run compiles snsim's sources again (about 0.1 s).  ``all`` is also timed
without ``dtr`` (every other policy, planned, verified and simulated in one
process through ``snsim.evaluate``, as ``--policy all`` does), as that planner
has its own issue.
Beside the wall time, the process's CPU time (user + system, from
``os.wait4``): on a machine other work shares, the wall time counts the
waiting, the CPU time does not.  A simpy loop of the simulator's three-process shape gives the reference
events/s on this machine in the same minutes.  Prints only; no assertions.

    python benchmarks/bench_whole.py [--repeats 5] [--trace traces/k40c_resnet2500_b32.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


ALL_BUT_DTR = """
import json, sys
from snsim import policies
from snsim.evaluate import evaluate_many
from snsim.graph import Graph
from snsim.inputs import load_trace
names = [n for n in policies.names() if n != "dtr"]
evs = evaluate_many(Graph(load_trace(sys.argv[1])), names)
print(json.dumps([e.result.to_dict() for e in evs], indent=1))
"""


def run_once(argv: list[str]) -> tuple[float, float, int, float]:
    """(wall seconds, peak RSS MiB, exit code, CPU seconds) of one ``snsim`` process
    (``argv[0] == "-c"``: a Python snippet instead of the CLI)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, *argv] if argv[0] == "-c" else [sys.executable, "-m", "snsim.cli", *argv]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode not in (0,):
        print(f"    ! exit {proc.returncode}: {err.strip()[:200]}")
    return wall, usage.ru_maxrss / 1024, proc.returncode, usage.ru_utime + usage.ru_stime


def simpy_reference(n: int = 20_000) -> float:
    """Events/s of bare simpy: a compute process with n timeouts, two idle copy stores."""
    import simpy

    env = simpy.Environment()
    h2d, d2h = simpy.Store(env), simpy.Store(env)

    def engine(q):
        while True:
            yield q.get()

    def compute():
        for _ in range(n):
            yield env.timeout(1.0)

    env.process(engine(h2d))
    env.process(engine(d2h))
    env.process(compute())
    t0 = time.perf_counter()
    env.run()
    return n / (time.perf_counter() - t0)


def main() -> None:
    global ROOT
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--trace", default="traces/k40c_resnet2500_b32.json")
    ap.add_argument("--root", default=str(Path(__file__).resolve().parent.parent),
                    help="the snsim checkout to time (another one: a before/after comparison)")
    ap.add_argument("--skip", default="",
                    help="comma-separated labels' first words to leave out (e.g. all,dtr)")
    args = ap.parse_args()
    ROOT = Path(args.root).resolve()   # run_once reads it
    t = args.trace
    cases = [
        ("liveness --json", ["simulate", t, "--policy", "liveness", "--json"], 0.5),
        ("superneurons --json", ["simulate", t, "--policy", "superneurons", "--json"], 1.0),
        ("dtr --budget 1.05xlb --json",
         ["simulate", t, "--policy", "dtr", "--budget", "1.05xlb", "--json"], 2.0),
        ("all --json", ["simulate", t, "--policy", "all", "--json"], 4.0),
        ("all but dtr (in one process)", ["-c", ALL_BUT_DTR, t], 4.0),
        ("liveness (table)", ["simulate", t, "--policy", "liveness"], None),
        ("info", ["info", t], None),
        ("quick start: resnet50 all 1.5GiB",
         ["simulate", "traces/k40c_resnet50_b32.json", "--policy", "all", "--budget", "1.5GiB"],
         None),
    ]
    print(f"whole process, median of {args.repeats} (python -m snsim.cli ..., {t}); "
          f"load average {os.getloadavg()[0]:.2f}")
    run_once(cases[0][1])   # warm-up: the bytecode cache
    peak_rss = 0.0
    skip = {w for w in args.skip.split(",") if w}
    cases = [c for c in cases if c[0].split()[0] not in skip]
    for label, argv, target in cases:
        runs = [run_once(argv) for _ in range(args.repeats)]
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[3] for r in runs)
        rss = max(r[1] for r in runs)
        if t in argv and argv[0] in ("simulate", "-c"):
            peak_rss = max(peak_rss, rss)
        verdict = "" if target is None else (
            f"target <= {target:.1f} s: {'met' if wall <= target else 'MISSED'}"
            f" (CPU: {'met' if cpu <= target else 'MISSED'})")
        print(f"  {label:<30} {wall:6.3f} s  CPU {cpu:6.3f} s  peak RSS {rss:6.1f} MiB  "
              f"{verdict}", flush=True)
    print(f"  peak RSS of a {Path(t).stem} simulation: {peak_rss:.1f} MiB "
          f"(target <= 400 MiB: {'met' if peak_rss <= 400 else 'MISSED'})")
    ref = statistics.median(simpy_reference() for _ in range(3))
    print(f"  load average now {os.getloadavg()[0]:.2f}")
    print(f"  bare simpy, three-process shape: {ref / 1e6:.2f} M events/s on this machine now "
          "(the simulator's target: >= 0.5 M events/s, benchmarks/bench_core.py)")


if __name__ == "__main__":
    main()
