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
``AHEAD`` checkpoint steps ahead, as far as memory allows without evicting
anything needed sooner (``utp`` keeps the paper's one), and plans each
candidate at each distance of ``AHEAD`` (4, 16 and 8), keeping the fastest: the
best distance depends on the budget (the issue-15 comparison with ``optimal``
found it).  On the K40c ResNet-50 b32 trace, time/compute at 1.05 / 2 / 3x the
lower bound: 4 ahead 1.7064 / 1.1639 / 1.0895, 16 ahead 1.7602 / 1.1444 /
1.0545 (and 1 ahead, the paper's: 1.7455 / 1.3116 / 1.1803).  Above
``WIDE_LIMIT`` layers only the first distance is planned (on ResNet-2500 the
second gained <= 0.2% for twice the planning time).

Note 5 (cache size).  An LRU cache given more memory evicts later, and a later
eviction can land where the copy engines are busier: on the K40c
Inception-v4 b16 trace this planner was slower at 1.10x the lower bound
(1.1278 x compute) than at 1.05x (1.1013).  Each candidate is therefore also
planned with a cache of ``SHARES`` of the budget (97%; a plan that fits a
smaller budget fits this one) and timed under the real one: 1.10x -> 1.0959,
1.25x 1.0872 -> 1.0686.  Above ``WIDE_LIMIT`` layers only the whole budget.

Note 6 (how much cost-aware recomputation).  Note 3's choice is all or
nothing; where memory is short only in part of the network, recomputing every
segment pays compute for memory the budget had (K40c ResNet-50 b32 at 3x the
lower bound: no stall at all, the whole 4.8% over compute is 20 ms of
recomputation; Inception-v4 b16 at 2x likewise).  The largest activations of
these networks come first, so cost-aware recomputation is also planned for
only the segments starting in the first ``UNTIL`` share of the layers (half,
a quarter, and since note 9 also 3/8, 30%, a fifth and an eighth), the later
ones going to the tensor cache like checkpoints.
ResNet-50 b32 time/compute at 1.05 / 1.5 / 2 / 3x: 1.7064 / 1.2518 / 1.1444 /
1.0545 -> 1.6939 / 1.2394 / 1.1319 / 1.0288 (``stats["recompute_until"]``).
Above ``WIDE_LIMIT`` layers only all segments.

Note 7 (checkpoints by cost).  SuperNeurons' checkpoints are by kind: a conv
layer is never recomputed, however cheap.  ``optimal``'s plan for VGG-16 b32
at 1.10x the lower bound recomputed the first conv (3 input channels: its
recomputation takes 4 ms, copying its 392 MB output back 31 ms) and ran
1.03% faster than this planner.  So cost-aware recomputation is also planned
with :func:`cheap_checkpoints`: a conv layer (one consumer) whose
recomputation is faster than copying its output back to the device is not a
checkpoint.  K40c time/compute: VGG-16 b32 1.05x 1.0316 -> 1.0167 (below the
MILP's 1.0210), ResNet-50 b32 1.05 / 1.5 / 2x 1.6939 / 1.2394 / 1.1319 ->
1.5719 / 1.1093 / 1.0879.  Above ``WIDE_LIMIT`` layers only by kind.

Note 8 (estimating less).  A candidate only has to beat the best so far, so
its estimate stops once it is known to be slower (:func:`replay.estimate_ms`
with a ``limit``, its note 3), and only the chosen plan's statistics are
gathered.  Above ``WIDE_LIMIT`` layers the cache-only plan, which wins ties
as it comes first, is estimated after the cost-aware one, against it: on
ResNet-2500 b32 it waits for copies where cost-aware recomputes, and its
estimate stops after 15% of its ops (4% at 1.05x the lower bound).  The plan
chosen, and every number reported, are those of estimating in order.

Note 9 (refining the plan; issue 15).  ``optimal``'s plan was, on every
K40c ResNet and Inception-v4 budget not at the compute bound, this
planner's under other knobs, polished: recomputations undone (kept where
the budget holds them), trimmed (a batch norm remade only for its saved
statistics) or swapped where that is faster.  Keeping what the budget
holds, and swapping what the copy engines have time for, is what the
paper's cost-aware recomputation and tensor cache mean to do; the segment
rule does it by segment, not by layer.  So up to ``WIDE_LIMIT`` layers: the
grid has the knob values the optimum's plans used (``UNTIL`` 3/8 .. 1/8,
``AHEAD`` 8; the earlier values first, so a tie keeps the plan chosen
before), the fastest cost-aware setting is also planned with caches of
``MORE_SHARES`` of the budget, and the ``TOP`` fastest distinct plans are
refined (:func:`polish.refine`: one pass, costliest recomputation first,
estimating at most ``REFINE_WORK`` ops in all, so the same plan on every
machine), keeping the fastest (``stats["refined"]``: changes made).  Each
change is kept only if the plan fits and is faster by the simulator's
rules, so the plan is never slower than the grid's best.  K40c time /
compute before -> after (the issue-15 optimum in brackets): ResNet-50 b32
1.05 / 1.5 / 2 / 3x 1.5719 / 1.1093 / 1.0879 / 1.0288 -> 1.5324 / 1.0760 /
1.0252 / 1.0145 (1.5263 / 1.0730 / 1.0252 / 1.0090); ResNet-152 b32 1.5x
1.0509 -> 1.0336 (1.0337); within 0.6% of the optimum at every budget
(1.05-3x) of every shipped K40c trace but ResNet-2500 (above ``WIDE_LIMIT``:
planned as before).  ResNet-152 b32 at 1.5x, the whole `snsim simulate`:
0.27 -> 1.1 s (2.2 -> 10.6 G instructions).

Note 10 (refining the swaps).  The tensor cache prefetches at checkpoint
steps, and on the K40c ResNets at tight budgets the refined plan still
stalled on prefetches issued right before their waits (ResNet-50 b32 at
1.25x the lower bound: 96.8 ms of stall, 'wait G26', 'wait X26', 'wait
G16' 8.4 ms each, 106 MB at 12.6 GB/s).  So the best refined plan's swaps
are refined too (:func:`polish.refine_swaps`, :mod:`.retime`: each
prefetch, largest first, kept instead, recomputed instead, its offload
issued first, or issued 1-32 computes sooner), in passes, estimating at
most ``SWAP_WORK`` ops, so the same plan on every machine; each change
only if the plan fits and is faster, as in note 9.  K40c time / compute
before -> after: ResNet-50 b32 1.05 / 1.10 / 1.25 / 1.5x 1.5324 / 1.4321 /
1.3244 / 1.0760 -> 1.4698 / 1.2826 / 1.1794 / 1.0595; ResNet-50 b16
1.4449 / 1.4256 / 1.2371 / 1.0468 -> 1.2812 / 1.2952 / 1.1000 / 1.0450;
ResNet-152 b32 1.25 / 1.5x 1.1069 / 1.0336 -> 1.0678 / 1.0331.  About
0.2-0.4 s more planning on these (nothing above ``WIDE_LIMIT`` layers).
The plan whose recomputations refine best is not the one whose swaps do
(ResNet-50 b16 at 1.10x: the fastest refined plan's swaps refined without
a limit, 1.4256 -> 1.2644; the fourth's, a 97% cache, 1.4299 -> 1.2281,
where ``optimal`` found 1.2318).  So each of the ``TOP`` plans' swaps are
probed (at most ``SWAP_PROBE`` ops estimated each), and the fastest then
refined (``SWAP_WORK``); :class:`replay.Resumable` replays each change
from the state before it, which halves an estimate.  K40c time / compute
before -> after: ResNet-50 b32 1.05 / 1.10 / 1.25 / 1.5x 1.4698 / 1.2826 /
1.1794 / 1.0595 -> 1.4493 / 1.2661 / 1.1663 / 1.0560, b16 1.05 / 1.10 /
1.5x 1.2812 / 1.2952 / 1.0450 -> 1.2646 / 1.2281 / 1.0355; ResNet-101 b16
1.05 / 1.25x 1.1764 / 1.0398 -> 1.1592 / 1.0324, b32 1.05x 1.1770 ->
1.1598; ResNet-152 b16 1.05x 1.1739 -> 1.1231, b32 1.10x 1.1360 -> 1.1213
(``optimal``'s 60 s plans before this: 1.1595 and 1.1210).  The whole
``snsim simulate --json`` on ResNet-152 b16 at 1.05x: 1.8 -> 3.0 s;
ResNet-50 b32 at 1.25x: 0.9 -> 1.5 s.  Then a swap may also be replaced by
remaking its tensor's segment (:func:`retime.recompute_chain`: the inputs
gone by then remade first), what ``optimal``'s tail did on ResNet-50 b32 at
1.05x: 1.4493 / 1.2661 / 1.1663 -> 1.4436 / 1.2603 / 1.1512 at 1.05 / 1.10
/ 1.25x, b16 1.2646 / 1.2281 -> 1.2589 / 1.2224 at 1.05 / 1.10x, ResNet-101
b16 and b32 at 1.05x 1.1592 / 1.1598 -> 1.1561 / 1.1567.

Note 11 (the recomputations once more).  A swap refined away frees memory
or a copy engine's time that a recomputation kept for want of it can then
use: ``optimal``'s polish, which ends with the recomputations' moves after
the swaps', took this planner's plan for ResNet-152 b16 at 1.05x the lower
bound from 1.1231 to 1.0865 x compute.  So after the swaps the
recomputations are refined once more (:func:`polish.refine`, the same
``REFINE_WORK``).  K40c time / compute before -> after: ResNet-152 b16
1.05x 1.1231 -> 1.0921, ResNet-50 b32 1.25 / 1.5x 1.1512 / 1.0560 ->
1.1422 / 1.0525, ResNet-101 b32 1.05x 1.1567 -> 1.1563, Inception-v4 b16
1.05x 1.0787 -> 1.0781.  Planning all K40c traces but ResNet-2500 at 1.05x
and 1.5x: 44.8 -> 49.8 s of CPU.  More rounds (the swaps again, then the
recomputations, three times) reached 1.0854 and 1.0509 on ResNet-152 b16
at 1.05x and ResNet-50 b32 at 1.5x for 60.7-69.2 s: left out.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, NamedTuple

from snsim.graph import Graph
from snsim.policies import register
from snsim.policies import finishing
from snsim.policies import layers
from snsim.policies import polish
from snsim.policies import replay
from snsim.policies import sequences
from snsim.policies.base import PlanContext
from snsim.policies.liveness import plan_liveness
from snsim.policies.recompute import segment_modes
from snsim.policies.utp import checkpoint_cache
from snsim.schedule.ops import Schedule

CANDIDATES = ("cache-only", "cost-aware", "memory-centric")
# Prefetch distances in checkpoint steps, each planned (note 4).
AHEAD = (4, 16, 8)
# Cache sizes planned, as shares of the budget (note 5).
SHARES = (1.0, 0.97)
# Cost-aware recomputation of the segments starting in this share of the
# forward layers (1.0: all), each planned (note 6).
UNTIL = (1.0, 0.5, 0.25, 0.375, 0.3, 0.2, 0.125)
# The fastest plans refined (note 9), estimating at most this many ops in all
# (~0.6 s on ResNet-152: about one plan; every recomputation of the
# four plans on ResNet-50).
TOP = 4
REFINE_WORK = 1_000_000
# Each plan's swaps refined (note 10), estimating at most this many ops per
# plan, then the best plan's, at most this many more
SWAP_PROBE = 300_000
SWAP_WORK = 3_000_000
# Smaller caches planned for the fastest cost-aware setting (note 9).
MORE_SHARES = (0.9, 0.85)
# Above this many layers only the first distance, the whole budget and all
# segments are planned, nothing refined (when the grid was 12 plans instead of 2
# it cost ~6x the planning: 2.15 s on a 4,000-layer ResNet at 1.05x; the shipped
# traces but ResNet-2500 have <= 516 layers, and the scaling benchmark's depths
# start at 1,000).
WIDE_LIMIT = 600


class _Plan(NamedTuple):
    ms: float            # estimated iteration time (inf: does not fit)
    kind: str
    ops: list
    stats: Callable[[], dict]   # made for the chosen plan only (note 8)
    reason: str | None
    setting: tuple = ()   # (checkpoints kept, by cost, until, ahead) of a cost-aware plan


def _stats(seg_stats: dict, cache, more: dict | None = None) -> Callable[[], dict]:
    return lambda: {**seg_stats, **cache.stats(), **(more or {})}


def early_only(graph: Graph, keep: list[bool], until: float) -> list[bool]:
    """``keep`` with the segments that start at or after ``until`` x the layer
    count kept too (not recomputed: their outputs go to the tensor cache)."""
    keep = list(keep)
    segs, _ = layers.segments(graph, keep)
    for seg in segs:
        if min(seg) >= until * graph.n:
            for i in seg:
                keep[i] = True
    return keep


def cheap_checkpoints(graph: Graph, keep: list[bool]) -> list[bool]:
    """``keep`` less the conv layers with one consumer whose recomputation (its
    least-workspace algorithm) takes less time than copying their output back
    (note 7)."""
    h2d_ms = 1e3 / graph.trace.device.h2d_Bps
    keep = list(keep)
    for i, layer in enumerate(graph.layers):
        if (keep[i] and layer.kind == "conv" and len(graph.consumers[i]) <= 1
                and i < graph.n - 1
                and graph.step_ms(("R", i), 0) < layer.output_bytes * h2d_ms):
            keep[i] = False
    return keep


def candidate(graph: Graph, capacity: int, kind: str, keep: list[bool], ahead: int = AHEAD[0],
              until: float = 1.0):
    """Ops, stats and shortfall reason of one candidate plan (``until``: note 6)."""
    ops, seg_stats, cache = planned(graph, capacity, kind, keep, ahead, until)
    return ops, {**seg_stats, **cache.stats()}, cache.reason


def planned(graph: Graph, capacity: int, kind: str, keep: list[bool], ahead: int = AHEAD[0],
            until: float = 1.0):
    """:func:`candidate`'s ops, its segment statistics and the cache planner that
    made the ops (its statistics and reason)."""
    if kind == "cache-only":
        seq, seg_stats = list(graph.route), {}
    else:
        if until < 1.0:
            keep = early_only(graph, keep, until)
        speed, seg_stats = segment_modes(graph, keep, "cost" if kind == "cost-aware" else "memory")
        seq = sequences.recompute_sequence(graph, keep, speed)
    cache = checkpoint_cache(graph, seq, capacity, dyn_ws=True, ahead=ahead)
    return cache.run(), seg_stats, cache


@register("superneurons", "liveness + tensor cache + cost-aware recompute + dynamic workspace",
          order=60, needs=("backward",), options=("offload_optimizer",))
def plan_superneurons(ctx: PlanContext) -> Schedule:
    g = ctx.graph
    cap = ctx.capacity_bytes
    keep = layers.checkpoints(g)
    best: _Plan | None = None
    wide = g.n <= WIDE_LIMIT
    top: list[_Plan] = []   # the TOP fastest fitting plans, fastest first (note 9)
    tries = [(share, ahead) for share in (SHARES if wide else SHARES[:1])
             for ahead in (AHEAD if wide else AHEAD[:1])]
    held: _Plan | None = None   # the cache-only plan above WIDE_LIMIT (note 8)
    for kind in CANDIDATES:
        if kind == "memory-centric" and best.reason is None:
            break   # only when nothing fits: it never ran faster than cost-aware (note 3)
        untils = UNTIL if kind == "cost-aware" and wide else (1.0,)
        keeps = [(False, keep)]
        if kind == "cost-aware" and wide:
            cheap = cheap_checkpoints(g, keep)
            if cheap != keep:
                keeps.append((True, cheap))
        for (by_cost, kp), until, (share, ahead) in itertools.product(keeps, untils, tries):
            ops, seg_stats, cache = planned(g, int(cap * share), kind, kp, ahead, until)
            reason = cache.reason
            if reason is None and kind == "cache-only" and cache.n_evict == 0:
                # liveness fits: pure compute
                best = _Plan(0.0, kind, ops, _stats(seg_stats, cache), None)
                break
            # (a backward step with a measured hand-over peak, bwd_released, is one
            # whose plain workspace the graph leaves to the ledger: None)
            if kind == "cache-only" and (share, ahead) == tries[0] and \
                    None in g.plain_workspace["B"]:
                live = plan_liveness(PlanContext(g)).ops
                if replay.fits(g, live, cap):
                    # liveness fits once its backward steps hand their dying reads to
                    # autograd (bwd_released), which the cache's step-by-step check
                    # cannot count on: pure compute
                    best = _Plan(0.0, "liveness", live, lambda: {"evictions": 0}, None)
                    break
            if reason is not None and share < 1.0:
                continue   # a smaller cache that does not fit says nothing about this budget
            more = setting_stats(ahead, share, until, by_cost)
            plan = _Plan(math.inf, kind, ops, _stats(seg_stats, cache, more), reason,
                         (kp, by_cost, until, ahead))
            if reason is None and kind == "cache-only" and not wide:
                held = plan   # estimated after cost-aware, against it (note 8)
                continue
            if reason is None:   # only to beat the best so far, or the TOP-th (notes 8, 9)
                if wide:
                    plan = plan._replace(ms=replay.estimate_ms(
                        g, ops, cap, top[-1].ms if len(top) >= TOP else math.inf))
                    keep_top(top, plan)
                else:
                    plan = plan._replace(ms=replay.estimate_ms(
                        g, ops, cap, math.inf if best is None else best.ms))
            if best is None or plan.ms < best.ms:   # the first infeasible one if none fits
                best = plan
        if held is not None and kind == "cost-aware":
            ms = replay.estimate_ms(g, held.ops, cap, best.ms)
            if ms <= best.ms:   # it comes first: a tie is its
                best = held._replace(ms=ms)
            held = None
        if best is not None and best.ms == 0.0:
            break
    if wide and 0 < best.ms < math.inf:
        if best.kind == "cost-aware":
            for plan in smaller_caches(g, cap, best):
                plan = plan._replace(ms=replay.estimate_ms(
                    g, plan.ops, cap, top[-1].ms if len(top) >= TOP else math.inf))
                keep_top(top, plan)
                if plan.ms < best.ms:
                    best = plan
        best = refined(g, cap, top)   # top[0] is best, unless refining another is faster
    stats = {"plan": best.kind, **best.stats()}
    if 0 < best.ms < math.inf:
        stats["estimated_ms"] = round(best.ms, 6)
    ops, reason = best.ops, best.reason
    return finishing.finish("superneurons", g, ops, ctx.budget_bytes, stats, reason)


def setting_stats(ahead: int, share: float, until: float, by_cost: bool) -> dict:
    """A candidate's knobs as its statistics: the prefetch distance, and each
    other knob where it is not the default (the whole budget, all segments,
    checkpoints by kind)."""
    return {"ahead": ahead, **({"cache_share": share} if share < 1.0 else {}),
            **({"recompute_until": until} if until < 1.0 else {}),
            **({"checkpoints": "by cost"} if by_cost else {})}


def smaller_caches(g: Graph, cap: int, plan: _Plan) -> list[_Plan]:
    """``plan``'s setting with the caches of :data:`MORE_SHARES` of the budget
    that fit (note 9)."""
    kp, by_cost, until, ahead = plan.setting
    out = []
    for share in MORE_SHARES:
        ops, seg_stats, cache = planned(g, int(cap * share), "cost-aware", kp, ahead, until)
        if cache.reason is None:
            more = setting_stats(ahead, share, until, by_cost)
            out.append(_Plan(math.inf, "cost-aware", ops, _stats(seg_stats, cache, more), None,
                             plan.setting))
    return out


def keep_top(top: list[_Plan], plan: _Plan) -> None:
    """Put ``plan`` in ``top`` (fastest first, a tie after those planned before)
    if it is among the :data:`TOP` fastest and not the same plan as one there."""
    if len(top) >= TOP and not plan.ms < top[-1].ms:
        return
    if any(p.ms == plan.ms and p.ops == plan.ops for p in top):
        return   # the same plan from another setting
    top.append(plan)
    top.sort(key=lambda p: p.ms)   # stable
    del top[TOP:]


def refined(g: Graph, cap: int, top: list[_Plan]) -> _Plan:
    """The fastest of ``top``'s plans, each with its recomputations refined
    (:func:`polish.refine`: undone, trimmed or swapped where that is faster;
    note 9) and its swaps probed, the fastest's swaps refined further (note
    10) and then its recomputations once more (note 11); a tie is the plan
    planned first."""
    best = None
    converged = False   # the best plan's probe ended on a pass that changed nothing
    work = polish.Work(REFINE_WORK // len(top[0].ops))
    for plan in top:
        plan = with_changes(plan, polish.refine(g, cap, plan.ops, plan.ms, work))
        # note 10: each plan's swaps probed, the best continued
        probe = polish.Work(SWAP_PROBE // len(plan.ops))
        plan = with_changes(plan, polish.refine_swaps(g, cap, plan.ops, plan.ms, probe))
        if best is None or plan.ms < best.ms:
            best, converged = plan, probe.left > 0
    if not converged:   # (a probe that converged: the same pass changes nothing)
        best = with_changes(best, polish.refine_swaps(
            g, cap, best.ops, best.ms, polish.Work(SWAP_WORK // len(best.ops))))
    # note 11: what the swaps freed lets recomputations go
    return with_changes(best, polish.refine(g, cap, best.ops, best.ms,
                                            polish.Work(REFINE_WORK // len(best.ops))))


def with_changes(plan: _Plan, got: tuple[float, list, int]) -> _Plan:
    """``plan`` with a refinement's result ``(ms, ops, changed)`` where it changed
    something (its changes counted in ``stats["refined"]``)."""
    ms, ops, changed = got
    if not changed:
        return plan
    return plan._replace(ms=ms, ops=ops, stats=refined_stats(plan.stats, changed))


def refined_stats(stats: Callable[[], dict], changed: int) -> Callable[[], dict]:
    """``stats`` with ``changed`` more refinements counted (``stats["refined"]``)."""
    def more() -> dict:
        got = stats()
        return {**got, "refined": got.get("refined", 0) + changed}
    return more
