#!/usr/bin/env python3
"""Core speed: a 10^4-layer chain and a ResNet-2500-shaped DAG under ``liveness``.

Prints wall time per phase (graph analysis, planning, verification,
simulation) and the simulator's throughput: the schedule's ops replayed per
second (each op is one event of the simulated machine; target, issue 13: at
least 0.5 M/s on the three-process shape, a schedule with copies, here
``vdnn-all``), beside the simpy events the replay scheduled per second
(fewer events per op is faster: a copy costs a timeout, and an event to wake
an idle engine; a compute step or a wait costs none, the compute stream runs
the events due before it goes on, see ``snsim.sim.clock``) and bare simpy's
rate in the same minutes.
A schedule without copies (``liveness``) replays in one pass without simpy.  Target (issue 2): the
10^4-layer liveness run (plan + simulate) in at most 0.5 s on a 2-core
machine.  Median of ``--repeats`` runs; no assertions.

    python benchmarks/bench_core.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from snsim import synth
from snsim.graph import Graph
from snsim.policies import plan
from snsim.policies.base import PlanContext
from snsim.schedule import verify
from snsim.sim import engine, simulate


BUDGET = 2**40  # 1 TiB: large enough that every run completes (this measures speed)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def bench(name: str, trace, repeats: int, policy: str = "liveness") -> None:
    rows = []
    for _ in range(repeats):
        g, t_graph = timed(lambda: Graph(trace))
        s, t_plan = timed(lambda: plan(policy, PlanContext(g)))
        _, t_verify = timed(lambda: verify(g, s))
        run = {}

        def sim():
            r = engine.Replay(g, s, BUDGET, record=False)
            r.run()
            run["events"] = r.env.scheduled if r.copies else 0
            return r

        _, t_sim = timed(sim)
        r, t_sim_rec = timed(lambda: simulate(g, s, BUDGET, record=True))
        assert r.feasible, r.reason
        rows.append((t_graph, t_plan, t_verify, t_sim, t_sim_rec, run["events"], len(s.ops), r))
    med = [statistics.median(col) for col in list(zip(*rows))[:5]]
    events, nops, r = rows[-1][5], rows[-1][6], rows[-1][7]
    total = med[0] + med[1] + med[3]
    print(f"{name}: {len(trace.layers)} layers, {len(Graph(trace).route)} steps, {nops} ops, "
          f"{events} simpy events")
    ops_rate = nops / med[3] / 1e6
    if events > 10:
        rate = (f"{ops_rate:.2f} M ops/s, target >= 0.5: "
                f"{'met' if ops_rate >= 0.5 else 'MISSED'}; "
                f"{events / med[3] / 1e6:.2f} M simpy events/s")
    else:
        rate = f"no copies: one pass without simpy, {ops_rate:.2f} M ops/s"
    print(f"  graph {med[0]*1e3:7.1f} ms | plan {med[1]*1e3:7.1f} ms | verify "
          f"{med[2]*1e3:7.1f} ms | simulate {med[3]*1e3:7.1f} ms "
          f"({rate}) | simulate+timeline {med[4]*1e3:7.1f} ms")
    print(f"  graph+plan+simulate: {total:.3f} s   (peak {r.peak_bytes / 2**30:.2f} GiB, "
          f"iteration {r.iteration_ms:.1f} ms)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    bench("chain-10000 (liveness)", synth.chain(10_000), args.repeats)
    resnet = synth.resnet((6, 32, 788, 6), batch=16, image=227, model="resnet2500")
    bench("resnet-2500 [6,32,788,6] (liveness)", resnet, args.repeats)
    # the simpy path: a schedule with an offload and a prefetch per layer
    bench("resnet-2500 [6,32,788,6] (vdnn-all)", resnet, args.repeats, policy="vdnn-all")
    from bench_whole import simpy_reference   # this folder: run as a script

    print(f"bare simpy, three-process shape: {simpy_reference() / 1e6:.2f} M events/s on this "
          "machine now")


if __name__ == "__main__":
    main()
