"""``utp``: SuperNeurons' unified tensor pool on top of liveness.

Activations (outputs, saved extras, gradients) live in an LRU tensor cache,
like the release's global list: they stay on the device while memory allows;
when an allocation would exceed the budget, the least recently used
checkpoint outputs are evicted (copied to the host, then freed), as the paper
offloads those; other activations only when evicting every checkpoint output
is not enough (without them ResNet-50 stays above 1.2x its lower bound: a
residual branch's bn output and a pool's indices).  Before each checkpoint step
(:func:`layers.checkpoints`: conv, fc, add, concat, data, loss, forks), evicted
tensors needed up to the next checkpoint step are prefetched, one checkpoint
ahead, so the copy overlaps compute; anything still missing when a step needs
it is fetched on demand and waited for (a stall).  Everything else follows
liveness.

Paper versus release (SUPERNEURONS.md).  The paper copies tensors to the host
asynchronously right after the step that makes them and prefetches in
backward; that is the default.  The planner sees the whole route, so it copies
out only the tensors its cache will evict (``offload_all=True`` copies every
checkpoint output, as the paper's runtime, which cannot see ahead, does).  The release instead
copies a tensor out synchronously when an allocation fails, waits for it, and
brings it back synchronously on demand, with no prefetch:
``plan_utp(ctx, release=True)`` (not a registered name: the policy names are
fixed by DESIGN section 3).
"""

from __future__ import annotations

from snsim.graph import Graph
from snsim.policies import register
from snsim.policies import finishing
from snsim.policies import layers
from snsim.policies.base import PlanContext
from snsim.policies.cache import CachePlanner
from snsim.schedule.ops import Schedule


def checkpoint_cache(graph: Graph, seq, capacity: int, release: bool = False,
                     dyn_ws: bool = False, offload_all: bool = False,
                     ahead: int = 1) -> CachePlanner:
    """A :class:`CachePlanner` over all activations, prefetching at
    checkpoint steps (``ahead`` checkpoints ahead); ``run()`` it to get the ops."""
    ckpt = layers.checkpoints(graph)
    boundary = [ckpt[i] and ph != "R" for ph, i in seq]
    outputs = {("X", i) for i, c in enumerate(ckpt) if c}   # preferred victims
    return CachePlanner(graph, seq, capacity, prefer=outputs,
                        boundary=boundary, sync=release, dyn_ws=dyn_ws,
                        offload_all=offload_all, ahead=ahead)


@register("utp", "liveness + LRU tensor cache of checkpoint outputs, offload/prefetch",
          order=30, needs=("backward",), options=("offload_optimizer",))
def plan_utp(ctx: PlanContext, release: bool = False, offload_all: bool = False) -> Schedule:
    g = ctx.graph
    cache = checkpoint_cache(g, list(g.route), ctx.capacity_bytes, release=release,
                             offload_all=offload_all)
    ops = cache.run()
    stats = {**cache.stats(), "mode": "release" if release else "paper"}
    return finishing.finish("utp", g, ops, ctx.budget_bytes, stats, cache.reason)
