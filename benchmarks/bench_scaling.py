#!/usr/bin/env python3
"""Policies at scale: depth doubling from 1k to 32k layers (issue 13).

ResNet-shaped traces (``synth.resnet((3, 4, k, 3))``, bottleneck blocks
added to the third stage until the trace has about N layers), every policy
at 1.05x and 1.5x the lower bound: wall time of plan + verify + simulate,
in process, per depth; then the slope of log(time) over log(layers), a
least-squares fit over the depths, printed beside the target (<= 1.2: linear
or n log n), and the time at the deepest trace beside its target (<= 5 s).
With ``--repeats r`` each point is planned, verified and simulated r times
and the least wall (and CPU) time is kept: on a machine other work shares, the
other processes only ever add time, so the least of a few runs is the
figure closest to the idle one (one run per point by default; what a
planner caches per graph, such as the route's liveness, is then paid in the
first run only).  The r runs are r rounds over all the points of a depth
(every policy at both budgets, in the order printed), not r runs of one
point back to back: a burst of other work on the machine then lands on one
run of several points, not on every run of one point; and no run starts
with the caches warm from the same point's previous run, which only the
shallow traces (whose data fits the CPU's caches) can gain from, and which
so can steepen a slope.  Each run is still the whole point (plan, verify,
simulate); no point is dropped.
Each run of a point is made in a child process forked for it (where fork
exists; ``--in-process`` runs them all in this one, as before): the child
starts from this process's heap, the graph built and frozen, and pays for
what it touches of it (copy on write) and for every per-graph cache its
planner fills, as one command run by a user does.  In one process, a point
runs in a heap that the earlier points (other policies, other budgets) left
full of freed blocks scattered over the arenas, so the objects it makes lie
scattered too; on the deepest traces, whose data outgrows the CPU's caches,
that made the recomputation policies' points 20-40% slower than alone
(`recompute-speed` at 32k layers: 0.37 s in the full bench, 0.30 s alone),
and their slopes 1.16-1.29 where alone they read 1.02-1.10 (2026-12-07).
With ``--calls`` each point is also run once more under cProfile and the
slope of its Python function calls (builtins included) over the layers is
printed: the work done, which the machine's load does not change (a
quadratic loop of calls shows as 2.0 however busy the machine is).
Prints only; no assertions.

    python benchmarks/bench_scaling.py [--sizes 1000,2000,4000,8000,16000,32000]
                                       [--policies dtr,superneurons] [--repeats 3]
                                       [--calls] [--in-process]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import math
import os
import pstats
import time

from snsim import synth
from snsim.graph import Graph
from snsim.evaluate import evaluate
from snsim.policies import names
from snsim.policies.base import PlanContext

FACTORS = (1.05, 1.5)


def deep_resnet(layers: int):
    """A bottleneck ResNet with about ``layers`` layers (10 per block in stage 3)."""
    base = len(synth.resnet((3, 4, 1, 3), batch=8, image=64).layers)
    k = max(1, 1 + (layers - base) // 10)
    return synth.resnet((3, 4, k, 3), batch=8, image=64, model=f"resnet-deep{layers}")


def slope(xs: list[float], ys: list[float]) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-6)) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    num = sum((a - mx) * (b - my) for a, b in zip(lx, ly))
    den = sum((a - mx) ** 2 for a in lx)
    return num / den if den else float("nan")


def point(g: Graph, policy: str, ctx: PlanContext) -> tuple[float, float, bool]:
    """(wall s, CPU s, feasible) of one plan + verify + simulate in this process."""
    t0, c0 = time.perf_counter(), time.process_time()
    r = evaluate(g, policy, ctx.budget_bytes, context=ctx).result
    return time.perf_counter() - t0, time.process_time() - c0, r.feasible


def run(g: Graph, policy: str, ctx: PlanContext, isolate: bool) -> tuple[float, float, bool]:
    """:func:`point`, in a child forked for it when ``isolate``: the child starts
    from the parent's heap (the graph, frozen) and pays for what it touches of
    it (copy on write) and for every per-graph cache its planner fills, as a
    command run by a user does; what earlier points left in the heap (freed
    blocks scattered over the arenas, caches of other planners) is not
    there."""
    if not isolate:
        return point(g, policy, ctx)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: one point, its figures down the pipe, then gone
        code = 0
        try:
            os.close(rfd)
            dt, dc, ok = point(g, policy, ctx)
            os.write(wfd, f"{dt!r} {dc!r} {int(ok)}".encode())
        except BaseException:   # noqa: BLE001 - the parent reports it
            code = 1
        finally:
            os._exit(code)
    os.close(wfd)
    with os.fdopen(rfd) as fh:
        text = fh.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not text:
        raise SystemExit(f"bench_scaling: the point {policy} on {g.n} layers failed "
                         "in its child (run with --in-process to see why)")
    dt, dc, ok = text.split()
    return float(dt), float(dc), ok == "1"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,2000,4000,8000,16000,32000")
    ap.add_argument("--policies", default=",".join(names()))
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs per point; the least time is kept (default 1)")
    ap.add_argument("--calls", action="store_true",
                    help="also count each point's function calls (one profiled run more)")
    ap.add_argument("--in-process", action="store_true",
                    help="run every point in this process (default: each run of a "
                         "point in a child forked for it, where fork exists)")
    args = ap.parse_args()
    isolate = not args.in_process and hasattr(os, "fork")
    sizes = [int(s) for s in args.sizes.split(",")]
    pols = args.policies.split(",")
    times: dict[tuple[str, float], list[float]] = {(p, f): [] for p in pols for f in FACTORS}
    cpus: dict[tuple[str, float], list[float]] = {(p, f): [] for p in pols for f in FACTORS}
    feas: dict[tuple[str, float], list[bool]] = {(p, f): [] for p in pols for f in FACTORS}
    calls: dict[tuple[str, float], list[int]] = {(p, f): [] for p in pols for f in FACTORS}
    real = []
    for n in sizes:
        g = Graph(deep_resnet(n))
        # as the CLI does after loading a trace: the graph out of the collector's
        # generations (else a full pass over the previous depths' garbage and the
        # 32k-layer graph lands on whichever policy runs then: 1-2 s)
        gc.collect()
        gc.freeze()
        real.append(g.n)
        ctxs = {f: PlanContext(g, int(f * g.lower_bound_bytes)) for f in FACTORS}
        best = {key: [math.inf, math.inf, None] for key in times}   # wall, CPU, feasible
        for _ in range(max(1, args.repeats)):   # rounds over the depth's points
            for f in FACTORS:
                ctx = ctxs[f]
                for p in pols:
                    dt, dc, ok = run(g, p, ctx, isolate)
                    b = best[(p, f)]
                    b[0], b[1], b[2] = min(b[0], dt), min(b[1], dc), ok
        line = []
        for f in FACTORS:
            budget = ctxs[f].budget_bytes
            ctx = ctxs[f]
            for p in pols:
                dt, dc, ok = best[(p, f)]
                times[(p, f)].append(dt)
                cpus[(p, f)].append(dc)
                feas[(p, f)].append(ok)
                if args.calls:
                    prof = cProfile.Profile()
                    prof.runcall(evaluate, g, p, budget, context=ctx)
                    calls[(p, f)].append(pstats.Stats(prof).total_calls)
                line.append(f"{p}@{f}x {dt:.2f}s")
        print(f"{g.n} layers: " + ", ".join(line), flush=True)
    print()
    print(f"load average {os.getloadavg()[0]:.2f} (2 cores shared: read loaded times as "
          "up to about twice the idle ones)")
    print(f"plan+verify+simulate wall seconds by depth (least of {args.repeats} round(s) each, "
          + ("each run in a child forked for it)" if isolate else "every run in this process)")
          + f"  (layers {real}); slope of log time "
          "over log layers (target <= 1.2); deepest trace (target <= 5 s); beside each, the "
          "same from the process's CPU time (the machine is shared: the wall time counts "
          "waiting); F = feasible at the deepest")
    worst = worst_cpu = 0.0
    for f in FACTORS:
        for p in pols:
            ts, cs = times[(p, f)], cpus[(p, f)]
            k = slope(real, ts) if len(real) > 1 else float("nan")
            kc = slope(real, cs) if len(real) > 1 else float("nan")
            worst = max(worst, k) if not math.isnan(k) else worst
            worst_cpu = max(worst_cpu, kc) if not math.isnan(kc) else worst_cpu
            cells = " ".join(f"{t:6.2f}" for t in ts)
            print(f"  {p:>16} @ {f:.2f}x  {cells}  slope {k:5.2f} "
                  f"({'met' if k <= 1.2 else 'MISSED'}; CPU {kc:5.2f})  deepest {ts[-1]:5.2f} s "
                  f"({'met' if ts[-1] <= 5 else 'MISSED'}; CPU {cs[-1]:5.2f} s "
                  f"{'met' if cs[-1] <= 5 else 'MISSED'})  {'F' if feas[(p, f)][-1] else '-'}"
                  + (f"  calls slope {slope(real, calls[(p, f)]):.2f}"
                     if args.calls and len(real) > 1 else ""))
    print(f"  largest slope: {worst:.2f} wall, {worst_cpu:.2f} CPU (target <= 1.2)")
    if args.calls and len(real) > 1:
        kc = max(slope(real, c) for c in calls.values())
        print(f"  largest slope of function calls: {kc:.2f} (1.0: linear work; n log n a little over)")


if __name__ == "__main__":
    main()
