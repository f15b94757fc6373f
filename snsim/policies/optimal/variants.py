"""More plans to polish: ``superneurons`` under knob settings it does not keep
(a primal heuristic of ``optimal``; it proves nothing).

``superneurons`` keeps the fastest of its candidates (recompute until a
share of the layers, a cache of a share of the budget, a prefetch distance,
checkpoints by kind or by cost) and :mod:`snsim.policies.polish` then undoes, trims or
swaps that plan's recomputations.  The fastest candidate is not the one
that polishes best: one that recomputes more, or caches less (a smaller
cache evicts earlier, where the copy engines are idle: superneurons' note
5), leaves the polish more to take back.  On
K40c ResNet-50 b32 (time / compute, its own plan polished -> the best
variant polished, in ``optimal``'s 60 s): 3x 1.0161 -> 1.0090 (the first
1/8 recomputed, an 85% cache, 16 ahead), 2x 1.0488 -> 1.0252 (the first
fifth, checkpoints by cost, 8 ahead), 1.5x 1.0826 -> 1.0730 (the first
30%, by cost, 4 ahead).  With superneurons' own grid (until 1, 1/2, 1/4;
caches of 97% and all; 4 and 16 ahead) plus 8 and 32 ahead they were
1.0128 / 1.0337 / 1.0795.  So every setting of :data:`UNTIL` x
:data:`SHARES` x :data:`AHEAD` x both checkpoint rules is planned (576, 2 s
of CPU on ResNet-50, 7-8 s on Inception-v4 and ResNet-152, where the time
may cut the grid: it is planned most promising first), and the fastest are
polished, fastest first, while the time lasts.
"""

from __future__ import annotations

import itertools
import math
import time

from snsim.graph import Graph
from snsim.policies import layers, replay
from snsim.policies.polish import polish
from snsim.policies.superneurons import WIDE_LIMIT, cheap_checkpoints, planned

# the grid, planned in this order (until outermost, most promising first:
# where the time runs out, the rest are left out)
UNTIL = (0.25, 0.375, 0.125, 0.3, 0.2, 0.5, 0.75, 1.0)
SHARES = (1.0, 0.97, 0.94, 0.9, 0.85, 0.8)
AHEAD = (4, 16, 8, 32, 2, 64)


def variant_plans(g: Graph, cap: int, seconds: float) -> list:
    """[(ms, label, ops)] of the cost-aware ``superneurons`` plans over the grid
    that fit ``cap``, fastest first, one per distinct plan, planned within
    about ``seconds``; none above ``superneurons.WIDE_LIMIT`` layers (it plans
    one setting there)."""
    if g.n > WIDE_LIMIT:
        return []
    t0 = time.perf_counter()
    keep = layers.checkpoints(g)
    rules = [("kind", keep)]
    cheap = cheap_checkpoints(g, keep)
    if cheap != keep:
        rules.append(("cost", cheap))
    found, seen = [], set()
    for until, share, ahead, (rule, kp) in itertools.product(UNTIL, SHARES, AHEAD, rules):
        if time.perf_counter() - t0 > seconds:
            break
        ops, _, cache = planned(g, int(cap * share), "cost-aware", kp, ahead, until)
        if cache.reason is not None:
            continue
        key = tuple(ops)
        if key in seen:
            continue
        seen.add(key)
        ms = replay.estimate_ms(g, ops, cap)
        if ms < math.inf:
            found.append((ms, f"until={until} share={share} ahead={ahead} checkpoints={rule}",
                          ops))
    return sorted(found, key=lambda x: x[0])


def best_variant(g: Graph, cap: int, ms: float, seconds: float, per_plan: float,
                 skip: list = ()):
    """(ms, label, ops, changed) of the fastest variant, polished, if faster than
    ``ms``; else None.  Within about ``seconds`` in all, at most ``per_plan``
    polishing each; a variant whose ops are ``skip`` (the plan already
    polished) is not polished again."""
    t0 = time.perf_counter()
    best = None
    skip = list(skip)
    for vms, label, ops in variant_plans(g, cap, seconds / 2):
        if ops == skip:
            continue
        left = seconds - (time.perf_counter() - t0)
        if left <= 0:
            break
        got, pops, changed = polish(g, cap, ops, vms, min(per_plan, left))
        if got < ms - 1e-9 and (best is None or got < best[0]):
            best = (got, label, pops, changed)
    return best
