"""``vdnn-all`` and ``vdnn-conv``: vDNN (Rhu et al., MICRO 2016).

In forward, the input feature maps of every layer (``vdnn-all``) or of every
convolution (``vdnn-conv``) that backward will read are copied to the host
when their first such consumer starts (the copy overlaps that layer) and
freed after their last forward use; the free completes when the copy does,
and a later allocation that needs the memory waits for it.  In backward, the
tensors of the next backward step are prefetched while the current one runs
(one layer ahead), and each step waits for its own.  Without a budget this
plan is static; where it does not fit, the simulator reports a shortfall.

With a budget (``--budget``), the plan reads it, as vDNN's dynamic mode does
(vDNN_dyn first tries to train without offloading): of the tensors the rule
above would move, only the first k in forward order (those backward needs
last, so their copies have the most time to hide) are offloaded, k a small
one that fits the budget under the simulator's rules
(:func:`replay.estimate_ms`), found by bisection (fitting is not strictly
monotone in k, since a prefetch allocates a step early, so k may not be the
very smallest).  When even k = all does not fit, the full plan is kept and
the simulator reports the shortfall.  At a generous budget the plan moves
nothing and runs as fast as ``liveness``.
"""

from __future__ import annotations

import math
from bisect import bisect_left

from snsim.graph import Graph
from snsim.policies import register
from snsim.policies import finishing
from snsim.policies import replay
from snsim.policies import sequences
from snsim.policies.base import PlanContext
from snsim.schedule.ops import Compute, Free, Offload, Op, Prefetch, Schedule, Wait


def vdnn_ops(graph: Graph, conv_only: bool, limit: int | None = None) -> tuple[list[Op], dict]:
    """vDNN's ops; with ``limit``, only the first ``limit`` movable tensors move."""
    n, route = graph.n, graph.route
    size = graph.size
    last = graph.last_use
    uses, frees = sequences.use_positions(graph, route)
    # Tensors to move: X_j read by backward and input of a chosen consumer.
    moved: set = set()
    first_consumer: dict[int, list] = {}
    fwd_last: dict[int, list] = {}
    for j in range(n):
        t = ("X", j)
        if last.get(t, -1) < n:
            continue
        cons = [c for c in graph.consumers[j] if not conv_only or graph.layers[c].kind == "conv"]
        if not cons:
            continue
        if limit is not None and len(moved) >= limit:
            break
        moved.add(t)
        first_consumer.setdefault(min(cons), []).append(t)
        u = uses[t]   # sorted: the last forward use is the one before position n
        fwd_last.setdefault(u[bisect_left(u, n) - 1], []).append(t)
    ops: list[Op] = []
    on_host: set = set()
    inbound: set = set()
    stats = {"offloaded_bytes": 0, "offloaded_tensors": 0, "prefetched_bytes": 0,
             "cache_misses": 0, "prefetch_hits": 0}
    for p, step in enumerate(route):
        if p < n:
            for t in first_consumer.get(step[1], ()):
                ops.append(Offload(t))
                stats["offloaded_bytes"] += size(t)
                stats["offloaded_tensors"] += 1
            ops.append(Compute(*step))
            for t in frees[p]:
                if t not in moved:
                    ops.append(Free(t))
            for t in fwd_last.get(p, ()):
                ops.append(Free(t))
                on_host.add(t)
            continue
        for t in graph.needs(step):
            if t in inbound:
                ops.append(Wait(t))
                inbound.discard(t)
                stats["prefetch_hits"] += 1
            elif t in on_host:
                ops += [Prefetch(t), Wait(t)]
                on_host.discard(t)
                stats["prefetched_bytes"] += size(t)
                stats["cache_misses"] += 1
        if p + 1 < len(route):
            for t in graph.needs(route[p + 1]):
                if t in on_host:
                    ops.append(Prefetch(t))
                    on_host.discard(t)
                    inbound.add(t)
                    stats["prefetched_bytes"] += size(t)
        ops.append(Compute(*step))
        ops.extend(Free(t) for t in frees[p])
    return ops, stats


def plan_vdnn(name: str, ctx: PlanContext, conv_only: bool) -> Schedule:
    g = ctx.graph
    ops, stats = vdnn_ops(g, conv_only)
    if ctx.budget_bytes is not None:
        cap = ctx.budget_bytes
        total = stats["offloaded_tensors"]
        if math.isfinite(replay.estimate_ms(g, ops, cap)):
            lo, hi = 0, total      # bisection for a small k that fits
            while lo < hi:
                mid = (lo + hi) // 2
                if math.isfinite(replay.estimate_ms(g, vdnn_ops(g, conv_only, mid)[0], cap)):
                    hi = mid
                else:
                    lo = mid + 1
            if lo < total:
                ops, stats = vdnn_ops(g, conv_only, lo)
        stats = {**stats, "movable_tensors": total}
    return finishing.finish(name, g, ops, ctx.budget_bytes, stats)


@register("vdnn-all", "vDNN: offload every layer's input, prefetch one layer ahead",
          order=20, needs=("backward",), options=("offload_optimizer",))
def plan_vdnn_all(ctx: PlanContext) -> Schedule:
    return plan_vdnn("vdnn-all", ctx, conv_only=False)


@register("vdnn-conv", "vDNN: offload conv inputs, prefetch one layer ahead",
          order=21, needs=("backward",), options=("offload_optimizer",))
def plan_vdnn_conv(ctx: PlanContext) -> Schedule:
    return plan_vdnn("vdnn-conv", ctx, conv_only=True)
