#!/usr/bin/env python3
"""Swap and recompute policies: planning speed and quality (issue 4).

1. ResNet-2500-shaped trace (``synth.resnet((6, 32, 788, 6))``, batch 32,
   about 10^4 layers) under ``superneurons`` at the device budget: wall time of
   plan + verify + simulate (target: at most 1 s on the 2-core machine).
2. Per network (shaped traces of the paper's networks, then the profiler's
   modeled K40c traces in traces/): every policy's
   smallest feasible budget over the lower bound (bisection), and iteration
   time over pure compute time at a few budgets, from 1.05x the lower bound up
   to the ``liveness`` peak; then whether ``superneurons`` is feasible at 1.05x,
   fastest or within 5% of the fastest at each budget, and at exactly its
   compute time once the budget holds the liveness peak.

Pure compute = the route's steps with each layer's first algorithm
(``Graph.compute_ms``), the same denominator for every policy.  Prints only;
no assertions.

    python benchmarks/bench_policies.py [--quick] [--nets resnet50,vgg16]
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

from snsim import synth
from snsim.graph import Graph
from snsim.evaluate import evaluate
from snsim.policies import names
from snsim.trace.io import load

FACTORS = (1.05, 1.1, 1.25, 1.5, 2.0, 3.0)


def vgg16(batch: int = 32, image: int = 224):
    sb = synth.ShapeBuilder("vgg16", batch, (3, image, image))
    x = 0
    for width, n in ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3)):
        for _ in range(n):
            x = sb.relu(sb.conv(x, width, 3))
        x = sb.pool(x, 2, 2)
    for _ in range(2):
        x = sb.dropout(sb.relu(sb.fc(x, 4096)))
    sb.loss(sb.fc(x, 1000))
    return sb.build("VGG16-like chain")


def googlenet(batch: int = 32, image: int = 224):
    """GoogLeNet-shaped (inception v1 widths), an inception-like net."""
    sb = synth.ShapeBuilder("googlenet", batch, (3, image, image))
    x = sb.pool(sb.relu(sb.conv(0, 64, 7, 2, 3)), 3, 2, 1)
    x = sb.relu(sb.conv(sb.relu(sb.conv(x, 64, 1, 1, 0)), 192, 3))
    x = sb.pool(x, 3, 2, 1)
    spec = [(64, 96, 128, 16, 32, 32), (128, 128, 192, 32, 96, 64), "pool",
            (192, 96, 208, 16, 48, 64), (160, 112, 224, 24, 64, 64), (128, 128, 256, 24, 64, 64),
            (112, 144, 288, 32, 64, 64), (256, 160, 320, 32, 128, 128), "pool",
            (256, 160, 320, 32, 128, 128), (384, 192, 384, 48, 128, 128)]
    for m in spec:
        if m == "pool":
            x = sb.pool(x, 3, 2, 1)
            continue
        c1, r3, c3, r5, c5, cp = m
        b1 = sb.relu(sb.conv(x, c1, 1, 1, 0))
        b2 = sb.relu(sb.conv(sb.relu(sb.conv(x, r3, 1, 1, 0)), c3, 3))
        b3 = sb.relu(sb.conv(sb.relu(sb.conv(x, r5, 1, 1, 0)), c5, 5))
        b4 = sb.relu(sb.conv(sb.pool(x, 3, 1, 1), cp, 1, 1, 0))
        _, h, w = sb.shape(b1)
        x = sb.join("concat", [b1, b2, b3, b4], (c1 + c3 + c5 + cp, h, w))
    sb.loss(sb.fc(sb.dropout(sb.gap(x)), 1000))
    return sb.build("GoogLeNet-shaped inception net")


SHIPPED = ["k40c_resnet50_b32", "k40c_resnet101_b32", "k40c_resnet152_b32", "k40c_vgg16_b32",
           "k40c_inception_v4_b32", "k40c_alexnet_b128"]

NETS = {
    "resnet50": lambda: synth.resnet((3, 4, 6, 3), model="resnet50"),
    "resnet101": lambda: synth.resnet((3, 4, 23, 3), model="resnet101"),
    "resnet152": lambda: synth.resnet((3, 8, 36, 3), model="resnet152"),
    "vgg16": vgg16,
    "googlenet": googlenet,
}


def run(g: Graph, policy: str, budget: int | None):
    return evaluate(g, policy, budget).result


def smallest_budget(g: Graph, policy: str, hi: int, steps: int = 14) -> float | None:
    """Smallest feasible budget / lower bound, by bisection on [LB, hi]."""
    lb = g.lower_bound_bytes
    if not run(g, policy, hi).feasible:
        return None
    lo_b, hi_b = lb, hi
    if run(g, policy, lb).feasible:
        return 1.0
    for _ in range(steps):
        mid = (lo_b + hi_b) // 2
        if run(g, policy, mid).feasible:
            hi_b = mid
        else:
            lo_b = mid
    return hi_b / lb


def bench_resnet2500(repeats: int) -> None:
    cases = [("ResNet-2500-shaped [6,32,788,6], batch 32", synth.resnet((6, 32, 788, 6)))]
    for name in ("k40c_resnet2500_b32", "k40c_resnet2500_b16"):
        path = Path(__file__).resolve().parent.parent / "traces" / f"{name}.json"
        if path.exists():
            cases.append((f"shipped {name}", load(path)))
    for label, trace in cases:
        g = Graph(trace)
        times = []
        for _ in range(repeats):
            e = evaluate(g, "superneurons")
            s, r = e.schedule, e.result
            times.append((e.plan_s, e.simulate_s))
        tp = statistics.median(t for t, _ in times)
        ts = statistics.median(t for _, t in times)
        print(f"{label}: {g.n} layers, {len(s.ops)} ops, budget = device "
              f"{g.trace.device.memory_bytes / 2**30:.0f} GiB")
        print(f"  superneurons plan {tp:.3f} s + simulate {ts:.3f} s = {tp + ts:.3f} s "
              f"(target <= 1 s); feasible={r.feasible}, plan={s.stats.get('plan')}, "
              f"peak/LB {r.peak_bytes / g.lower_bound_bytes:.3f}, "
              f"time/compute {r.iteration_ms / g.compute_ms:.3f}")


def load_net(name: str):
    if name in NETS:
        return NETS[name]()
    return load(Path(__file__).resolve().parent.parent / "traces" / f"{name}.json")


def bench_net(name: str, policies: list[str]) -> None:
    g = Graph(load_net(name))
    lb = g.lower_bound_bytes
    live = run(g, "liveness", None).peak_bytes
    top = run(g, "none", 2**50).peak_bytes
    comp = g.compute_ms
    budgets = [(f"{f:.2f}xLB", int(lb * f)) for f in FACTORS if lb * f < live]
    budgets.append(("liveness", live))
    print(f"\n{name}: {g.n} layers, lower bound {lb / 2**20:.0f} MiB, liveness peak "
          f"{live / lb:.2f}x LB, pure compute {comp:.1f} ms")
    head = f"  {'policy':<17}{'min budget/LB':>14}" + "".join(f"{b:>10}" for b, _ in budgets)
    print(head)
    table = {}
    for p in policies:
        mb = smallest_budget(g, p, top)
        cells = []
        for label, b in budgets:
            r = run(g, p, b)
            t = r.iteration_ms / comp if r.feasible else math.inf
            table[(p, label)] = (t, r)
            cells.append(f"{t:10.3f}" if r.feasible else f"{'-':>10}")
        print(f"  {p:<17}{(f'{mb:.3f}' if mb else 'n/a'):>14}" + "".join(cells))
    # superneurons against the field
    verdicts = []
    for label, _ in budgets:
        best = min(table[(p, label)][0] for p in policies)
        sn = table[("superneurons", label)][0]
        verdicts.append(f"{label}: {'-' if sn == math.inf else f'{sn / best:.3f}'}")
    print("  superneurons time / fastest feasible: " + ", ".join(verdicts))
    over = []
    for label, _ in budgets:
        r = table[("superneurons", label)][1]
        over.append(f"{label}: {r.iteration_ms / r.compute_ms:.3f}" if r.feasible else f"{label}: -")
    print("  superneurons time / its own compute (its algorithms): " + ", ".join(over))
    r = table[("superneurons", "liveness")][1]
    print(f"  at the liveness peak: iteration {r.iteration_ms:.3f} ms, its compute "
          f"{r.compute_ms:.3f} ms, stall {r.stall_ms:.3f} ms, recompute {r.recompute_ms:.3f} ms "
          f"-> {'exactly pure compute' if r.iteration_ms == r.compute_ms else 'NOT pure compute'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--nets", default=",".join(list(NETS) + SHIPPED),
                    help="shaped networks (%s) or shipped trace names" % ", ".join(NETS))
    ap.add_argument("--skip-2500", action="store_true")
    args = ap.parse_args()
    if not args.skip_2500:
        bench_resnet2500(args.repeats)
    policies = [p for p in names()]
    for name in args.nets.split(","):
        bench_net(name, policies)


if __name__ == "__main__":
    main()
