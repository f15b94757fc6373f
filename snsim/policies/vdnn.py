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

from bisect import bisect_left
from itertools import accumulate
from operator import sub
from typing import Callable
from weakref import WeakKeyDictionary

from snsim.graph import Graph
from snsim.policies import register
from snsim.policies import finishing
from snsim.policies import replay
from snsim.policies import sequences
from snsim.policies.base import PlanContext
from snsim.schedule import ledger
from snsim.schedule.ops import Compute, Free, Offload, Op, Prefetch, Schedule, Wait


_MOVABLE: WeakKeyDictionary = WeakKeyDictionary()   # graph -> {conv_only: movable list}


def movable(graph: Graph, conv_only: bool) -> list[tuple]:
    """``(X_j, first chosen consumer, route position of X_j's last forward use)``
    of every tensor vDNN moves, in forward order: ``X_j`` read by backward and
    input of a chosen consumer (every layer, or convolutions).  Once per graph
    (a budget's bisection plans it a dozen times)."""
    per = _MOVABLE.setdefault(graph, {})
    got = per.get(conv_only)
    if got is not None:
        return got
    n, layers = graph.n, graph.layers
    last = graph.last_use
    uses, _ = sequences.use_positions(graph, graph.route)
    got = []
    for j in range(n):
        t = ("X", j)
        if last.get(t, -1) < n:
            continue
        cons = graph.consumers[j]
        if conv_only:
            cons = [c for c in cons if layers[c].kind == "conv"]
        if not cons:
            continue
        u = uses[t]   # sorted: the last forward use is the one before position n
        got.append((t, min(cons), u[bisect_left(u, n) - 1]))
    per[conv_only] = got
    return got


def vdnn_ops(graph: Graph, conv_only: bool, limit: int | None = None) -> tuple[list[Op], dict]:
    """vDNN's ops; with ``limit``, only the first ``limit`` movable tensors move."""
    n, route = graph.n, graph.route
    size = graph.sizes
    _, frees = sequences.use_positions(graph, route)
    chosen = movable(graph, conv_only)
    if limit is not None:
        chosen = chosen[:limit]
    moved = {t for t, _, _ in chosen}
    first_consumer: dict[int, list] = {}
    fwd_last: dict[int, list] = {}
    for t, c, q in chosen:
        first_consumer.setdefault(c, []).append(t)
        fwd_last.setdefault(q, []).append(t)
    ops: list[Op] = []
    append, extend = ops.append, ops.extend
    for p in range(n):
        for t in first_consumer.get(p, ()):
            append(Offload(t))
        append(Compute("F", p))
        fp = frees[p]
        if fp:
            extend([Free(t) for t in fp if t not in moved])
        for t in fwd_last.get(p, ()):
            append(Free(t))
    on_host = set(moved)
    inbound: set = set()
    pre_bytes = misses = hits = 0
    needs_of = graph.needs_map
    end = len(route)
    for p in range(n, end):
        step = route[p]
        if on_host or inbound:
            for t in needs_of[step]:
                if t in inbound:
                    append(Wait(t))
                    inbound.discard(t)
                    hits += 1
                elif t in on_host:
                    append(Prefetch(t))
                    append(Wait(t))
                    on_host.discard(t)
                    pre_bytes += size[t]
                    misses += 1
            if on_host and p + 1 < end:
                for t in needs_of[route[p + 1]]:
                    if t in on_host:
                        append(Prefetch(t))
                        on_host.discard(t)
                        inbound.add(t)
                        pre_bytes += size[t]
        append(Compute(*step))
        fp = frees[p]
        if fp:
            extend(map(Free, fp))
    stats = {"offloaded_bytes": sum(size[t] for t in moved), "offloaded_tensors": len(moved),
             "prefetched_bytes": pre_bytes, "cache_misses": misses, "prefetch_hits": hits}
    return ops, stats


def fit_test(graph: Graph, conv_only: bool, capacity: int) -> Callable[[int], bool]:
    """``k -> replay.fits(graph, vdnn_ops(graph, conv_only, k)[0], capacity)``, for the
    budget's bisection.

    Where it can, without building or walking a plan per ``k``: the plans differ
    only in which movable tensors are away, and each one's time away does not
    depend on the others (freed after its last forward use, prefetched one
    backward step before its first backward use, or at that step when it is the
    first backward step).  So with ``top[p]`` the level at route step ``p``'s
    compute op (its outputs and workspace included) in the plan that moves
    nothing, the plan moving the first ``k`` fits iff ``top[p]`` less the bytes of
    those away at ``p`` fits at every step, and the optimizer step the plans end
    with fits (every other op of a step is at or below its compute op, since no
    workspace is negative).  That holds unless a backward step hands its dying
    reads to autograd (``bwd_released``: whether it does depends on which
    tensors have a host copy) or a tensor is held past its uses (``holds``); there
    it walks each plan.  ``tests/test_vdnn_fit.py`` checks both agree.
    """
    def exact(k: int) -> bool:
        return replay.fits(graph, vdnn_ops(graph, conv_only, k)[0], capacity)

    if graph.holds or any(w.bwd_released is not None
                          for layer in graph.layers for w in layer.workspace):
        return exact
    n, sizes = graph.n, graph.sizes
    uses, _ = sequences.use_positions(graph, graph.route)
    spans = []
    for t, _, q in movable(graph, conv_only):
        u = uses[t]
        i = bisect_left(u, n)
        if i == len(u):
            return exact
        back = u[i]   # its first backward use; prefetched the step before (if backward)
        spans.append((q + 1, back - 1 if back - 1 >= n else back, sizes[t]))
    ops = replay.with_optimizer_step(graph, vdnn_ops(graph, conv_only, 0)[0])
    tops: list[int] = []
    tail = level = graph.trace.static_bytes
    for op, (nbytes, ws, freed) in zip(ops, ledger.iter_effects(graph, ops)):
        level += nbytes - freed
        if type(op) is Compute:
            if op.phase == "O":
                tail = max(tail, level + ws)
            else:
                tops.append(level + ws)
    if tail > capacity:
        return lambda k: False
    size = len(tops) + 1

    def fast(k: int) -> bool:
        away = [0] * size
        for start, end, b in spans[:k]:
            if start < end:
                away[start] += b
                away[end] -= b
        return max(map(sub, tops, accumulate(away)), default=0) <= capacity

    return fast


def plan_vdnn(name: str, ctx: PlanContext, conv_only: bool) -> Schedule:
    g = ctx.graph
    ops, stats = vdnn_ops(g, conv_only)
    if ctx.budget_bytes is not None:
        cap = ctx.budget_bytes
        total = stats["offloaded_tensors"]
        # a plan fits under the simulator's rules (a finite replay.estimate_ms) iff it
        # fits with every free counted as immediate (replay's note 1)
        fits = fit_test(g, conv_only, cap)
        if fits(total):
            lo, hi = 0, total      # bisection for a small k that fits
            while lo < hi:
                mid = (lo + hi) // 2
                if fits(mid):
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
