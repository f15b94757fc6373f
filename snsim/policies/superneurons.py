"""``superneurons``: liveness + unified tensor pool + cost-aware recomputation
+ dynamic convolution workspaces (Wang et al., PPoPP 2018).

The pieces are the other modules' (:mod:`.recompute`, :mod:`.utp`) joined on
one step sequence: forward, then backward with recomputed segments inserted;
activations live in the LRU tensor cache (evicted under the budget, copied out
asynchronously and prefetched ahead at checkpoint steps, paper mode) and are
freed after their last use (liveness); each step with workspace choices takes
the fastest algorithm whose workspace fits the memory free at that step, else
the smallest (functional tensors first: a workspace never evicts a tensor).

Note 3 (how much recomputation).  The paper's runtime recomputes every
non-checkpoint layer whatever the memory; it then cannot reach its own
"leading speed" when memory is plentiful.  This planner knows the budget and
the route, so it plans candidates and keeps the fastest that fits
(estimated with :func:`replay.estimate_ms`, the simulator's rules): no
recomputation (the cache alone) and cost-aware recomputation; only if neither
fits, all segments memory-centric (least memory; on the benchmark networks it
never ran faster than cost-aware, so it is not planned otherwise).  A plan
that fits with no eviction and no recomputation is taken at once: it runs at
pure compute time.
``stats["plan"]`` names the candidate chosen.

Note 4 (prefetch distance).  The paper prefetches one checkpoint ahead; with
PCIe copies of large early-layer tensors slower than one layer's compute, that
leaves stalls the budget could have hidden.  This planner prefetches up to
``AHEAD`` = 4 checkpoint steps ahead, as far as memory allows without evicting
anything needed sooner (``utp`` keeps the paper's one).  On the K40c
ResNet-50 trace at 3x the lower bound this takes time/compute from 1.187 to
1.096.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from snsim.graph import Graph
from snsim.policies import register
from snsim.policies import finishing
from snsim.policies import layers
from snsim.policies import replay
from snsim.policies import sequences
from snsim.policies.base import PlanContext
from snsim.policies.liveness import plan_liveness
from snsim.policies.recompute import segment_modes
from snsim.policies.utp import checkpoint_cache
from snsim.schedule.ops import Schedule

CANDIDATES = ("cache-only", "cost-aware", "memory-centric")
# Prefetch distance in checkpoint steps (note 4).
AHEAD = 4


class _Plan(NamedTuple):
    ms: float            # estimated iteration time (inf: does not fit)
    kind: str
    ops: list
    stats: dict
    reason: str | None


def candidate(graph: Graph, capacity: int, kind: str, keep: list[bool]):
    """Ops, stats and shortfall reason of one candidate plan."""
    if kind == "cache-only":
        seq, seg_stats = list(graph.route), {}
    else:
        speed, seg_stats = segment_modes(graph, keep, "cost" if kind == "cost-aware" else "memory")
        seq = sequences.recompute_sequence(graph, keep, speed)
    cache = checkpoint_cache(graph, seq, capacity, dyn_ws=True, ahead=AHEAD)
    ops = cache.run()
    return ops, {**seg_stats, **cache.stats()}, cache.reason


@register("superneurons", "liveness + tensor cache + cost-aware recompute + dynamic workspace",
          order=60, needs=("backward",), options=("offload_optimizer",))
def plan_superneurons(ctx: PlanContext) -> Schedule:
    g = ctx.graph
    cap = ctx.capacity_bytes
    keep = layers.checkpoints(g)
    best: _Plan | None = None
    for kind in CANDIDATES:
        if kind == "memory-centric" and best.reason is None:
            break   # only when nothing fits: it never ran faster than cost-aware (note 3)
        ops, stats, reason = candidate(g, cap, kind, keep)
        if reason is None and kind == "cache-only" and stats["evictions"] == 0:
            best = _Plan(0.0, kind, ops, stats, None)   # liveness fits: pure compute
            break
        if kind == "cache-only" and any(g.bwd_released(("B", i)) is not None
                                        for i in range(g.n)):
            live = plan_liveness(PlanContext(g)).ops
            if replay.fits(g, live, cap):
                # liveness fits once its backward steps hand their dying reads to
                # autograd (bwd_released), which the cache's step-by-step check
                # cannot count on: pure compute
                best = _Plan(0.0, "liveness", live, {"evictions": 0}, None)
                break
        ms = math.inf if reason else replay.estimate_ms(g, ops, cap)
        if best is None or ms < best.ms:   # the first infeasible one if none fits
            best = _Plan(ms, kind, ops, stats, reason)
    stats = {"plan": best.kind, **best.stats}
    if 0 < best.ms < math.inf:
        stats["estimated_ms"] = round(best.ms, 6)
    ops, reason = best.ops, best.reason
    return finishing.finish("superneurons", g, ops, ctx.budget_bytes, stats, reason)
