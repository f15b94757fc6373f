"""``dtr``: Dynamic Tensor Rematerialization (Kirisame et al., ICLR 2021).

Replays the route under the budget the way DTR's runtime would: liveness
frees what the route no longer needs; when an allocation does not fit, the
resident forward result (output and saved extras of one layer) with the
smallest ``h = cost / (size x staleness)`` is evicted, and a step that needs
an evicted tensor recomputes it on demand (``R`` steps), through evicted or
freed inputs back to resident ones; temporaries made only to recompute are
freed as soon as their last consumer in the chain has run.  ``staleness`` is
the planned compute time since the tensor was last used.

``cost`` is DTR's evicted neighbourhood e*: the layer's own forward time
plus that of every evicted layer connected to it through evicted layers
(inputs and consumers: the recomputes this eviction would lengthen).  As in
DTR's prototype, e* is kept as equivalence classes (union-find over the
evicted layers, each with its summed forward time): evicting a layer joins
its evicted neighbours' classes, so scoring a candidate costs its degree, not
a walk.  The prototype never splits a class, which over-states the cost once
a member is back; here a class that loses a member (recomputed, or no longer
needed by the route) is rebuilt into its connected pieces, so the classes
are exactly the components and the score is the exact one.  Two deliberate
approximations remain: a layer the route has freed (not evicted) is not in
any class, although a recompute may have to pass through it, and the
neighbourhood of a saved-extras-only eviction is that of its inputs.  Every
cost is finite: nothing is "too costly to evict"; a long chain is just
expensive, as in the paper.

Victims are chosen from a bounded sample, as DTR's prototype does: each
eviction scores ``SAMPLE`` evictable forward results drawn uniformly (a
seeded generator: plans are deterministic) and evicts the smallest score.
When at most ``SAMPLE`` are evictable they are all scored, so the choice is
the exact heuristic's (``tests/test_dtr.py`` checks it against a brute-force
scorer).  An eviction costs ``O(SAMPLE x degree)`` plus the amortized class
rebuilds, so planning is linear in the route and its recomputes.
Gradients and the data layer's output are never evicted; where a
recomputation would still need the data after its last use, the plan is
made again with the data kept to the end (the input is not recomputable).
Without a budget tighter than the liveness peak nothing is evicted: the plan
is liveness.

The eviction score is pluggable (:data:`HEURISTICS`, ``plan_dtr_ops(...,
heuristic=name)``), as DTR's paper compares several: ``dtr`` (the policy's
own, cost / (size x staleness)), ``lru`` (1 / staleness), ``size`` (1 /
size: the largest first) and ``msps`` (cost / size: memory saved per
second of recompute, no staleness).  The smallest score is evicted.
"""

from __future__ import annotations

import math
import random
from typing import Callable

from snsim.graph import Graph, Step, Tensor
from snsim.policies import register
from snsim.policies import finishing
from snsim.policies import replay
from snsim.policies import sequences
from snsim.policies.base import PlanContext
from snsim.schedule.ops import Compute, Free, Op, Schedule


# Candidates scored per eviction (all of them when fewer are evictable).
SAMPLE = 32
# An eviction that would make an evicted neighbourhood of more layers than this
# is not a candidate (infinite cost): every recompute chain stays this short.
CHAIN = 16


# score(cost_ms, size_bytes, staleness_ms) -> float; the smallest is evicted.
Heuristic = Callable[[float, int, float], float]
HEURISTICS: dict[str, Heuristic] = {
    "dtr": lambda cost, size, stale: cost / (size * stale),
    "lru": lambda cost, size, stale: 1.0 / stale,
    "size": lambda cost, size, stale: 1.0 / size,
    "msps": lambda cost, size, stale: cost / size,
}


class Planner:
    """DTR's replay of the route; :func:`plan_dtr_ops` runs it.

    State a scorer may read: ``resident`` (tensor -> last access, ms),
    ``pins`` (tensor -> pin count), ``evicted`` (layers whose output was
    evicted and not yet recomputed), ``clock`` (ms) and ``pos`` (route index).
    """

    def __init__(self, graph: Graph, capacity: int, score: Heuristic,
                 sample: int = SAMPLE, chain: int = CHAIN, seed: int = 0):
        self.g, self.cap, self.score, self.sample = graph, capacity, score, sample
        self.chain = chain
        self.level = graph.trace.static_bytes
        self.resident: dict[Tensor, float] = {}   # tensor -> last access (ms)
        self.pins: dict[Tensor, int] = {}
        self.evicted: set[int] = set()
        self.ops: list[Op] = []
        self.clock = 0.0
        self.pos = 0
        self.reason: str | None = None
        self.evictions = 0
        self.full_scans = 0
        self.keep_data = False   # the data layer's output stays to the end
        self.pool: list[int] = []          # layers with an evictable tensor resident
        self.slot: dict[int, int] = {}     # layer -> its index in ``pool``
        self.rng = random.Random(seed)
        self.inputs = [tuple(dict.fromkeys(layer.inputs)) for layer in graph.layers]
        self.fwd = [layer.fwd_ms for layer in graph.layers]
        self.consumers = [tuple(c) for c in graph.consumers]
        self.near = [i + c for i, c in zip(self.inputs, self.consumers)]
        self.x_bytes = [layer.output_bytes for layer in graph.layers]
        self.s_bytes = [layer.saved_extra_bytes for layer in graph.layers]
        # union-find over the evicted layers: root -> members, forward ms
        self.parent: dict[int, int] = {}
        self.members: dict[int, list[int]] = {}
        self.class_ms: dict[int, float] = {}
        self.dirty: set[int] = set()
        # route index after which nothing can be recomputed through X_j: the last
        # use of X_j or of a consumer's output
        last = graph.last_use
        self.horizon = [max([last.get(("X", j), -1)]
                            + [last.get(("X", c), -1) for c in graph.consumers[j]])
                        for j in range(graph.n)]
        self.expiry: dict[int, list[int]] = {}   # route index -> layers leaving ``evicted``

    def pin(self, ts) -> None:
        for t in ts:
            self.pins[t] = self.pins.get(t, 0) + 1

    def unpin(self, ts) -> None:
        for t in ts:
            self.pins[t] -= 1

    # ------------------------------------------------------------ the pool
    def _add(self, j: int) -> None:
        if j not in self.slot:
            self.slot[j] = len(self.pool)
            self.pool.append(j)

    def _drop(self, j: int) -> None:
        k = self.slot.pop(j)
        last = self.pool.pop()
        if last != j:
            self.pool[k] = last
            self.slot[last] = k

    # -------------------------------------------------------------- scoring
    def unit(self, j: int) -> list[Tensor] | None:
        """What evicting layer j's forward result frees (saved extras go with
        their output: an R step remakes both); None if it cannot go now."""
        res, pins = self.resident, self.pins
        x, s = ("X", j), ("S", j)
        if x in res:
            if pins.get(x):
                return None
            return [x, s] if s in res and not pins.get(s) else [x]
        if s in res and not pins.get(s):
            return [s]
        return None

    # ---------------------------------------- evicted neighbourhoods (classes)
    def _find(self, j: int) -> int:
        parent = self.parent
        root = j
        while parent[root] != root:
            root = parent[root]
        while parent[j] != root:   # path compression
            parent[j], j = root, parent[j]
        return root

    def _join(self, a: int, b: int) -> None:
        ra, rb = self._find(a), self._find(b)
        if ra == rb:
            return
        if len(self.members[ra]) < len(self.members[rb]):
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.members[ra].extend(self.members.pop(rb))
        self.class_ms[ra] += self.class_ms.pop(rb)
        if rb in self.dirty:
            self.dirty.discard(rb)
            self.dirty.add(ra)

    def _neighbours(self, j: int) -> list[int]:
        ev = self.evicted
        return [k for k in self.inputs[j] + self.consumers[j] if k in ev]

    def mark_evicted(self, j: int) -> None:
        """X_j leaves the device: it joins (and merges) its evicted neighbours' classes."""
        if j in self.evicted:
            return
        if self.dirty:   # j's old class (if any) lets go of it first
            self._split_dirty()
        self.evicted.add(j)
        self.expiry.setdefault(self.horizon[j], []).append(j)
        self.parent[j] = j
        self.members[j] = [j]
        self.class_ms[j] = self.fwd[j]
        for k in self._neighbours(j):
            self._join(j, k)

    def unmark_evicted(self, j: int) -> None:
        """X_j is back (recomputed) or no longer needed: its class splits (lazily)."""
        if j in self.evicted:
            self.evicted.discard(j)
            self.dirty.add(self._find(j))

    def _split_dirty(self) -> None:
        # Rebuild each class that lost members into the connected pieces of
        # what is still evicted: the classes are exactly the components.
        ev, inputs, consumers, fwd = self.evicted, self.inputs, self.consumers, self.fwd
        for root in self.dirty:
            old = self.members.pop(root)
            self.class_ms.pop(root)
            for m in old:
                self.parent.pop(m, None)
            left = [m for m in old if m in ev]
            for m in left:
                if m in self.parent:
                    continue
                self.parent[m] = m
                comp, stack = [m], [m]
                while stack:
                    k = stack.pop()
                    for q in inputs[k] + consumers[k]:
                        if q in ev and q not in self.parent:
                            self.parent[q] = m
                            comp.append(q)
                            stack.append(q)
                self.members[m] = comp
                self.class_ms[m] = sum(fwd[q] for q in comp)
        self.dirty.clear()

    def cost(self, j: int, with_consumers: bool = True) -> float:
        """Forward time of recomputing layer j: its own plus that of every
        evicted class next to it (through inputs, and consumers if evicting
        X_j, not only its saved extras); ``inf`` if together they would have
        more than ``CHAIN`` layers."""
        if self.dirty:
            self._split_dirty()
        ev = self.evicted
        near = [k for k in (self.inputs[j] + self.consumers[j] if with_consumers
                            else self.inputs[j]) if k in ev]
        if not near:   # the common case: a one-layer recompute
            return self.fwd[j]
        roots = {self._find(k) for k in near}
        if 1 + sum(len(self.members[r]) for r in roots) > self.chain:
            return math.inf
        return self.fwd[j] + sum(self.class_ms[r] for r in roots)

    def best(self, candidates) -> list[Tensor] | None:
        """The unit with the smallest finite score among ``candidates`` (layers).

        :meth:`unit` and :meth:`cost` inlined: this loop is the planner's hot path."""
        res, pins, ev = self.resident, self.pins, self.evicted
        xs, ss, fwd, near, ins = self.x_bytes, self.s_bytes, self.fwd, self.near, self.inputs
        score, clock, limit = self.score, self.clock, self.chain
        if self.dirty:
            self._split_dirty()
        best, best_h = None, None
        for j in candidates:
            x = ("X", j)
            if x in res:
                if pins.get(x):
                    continue
                s = ("S", j)
                unit = [x, s] if s in res and not pins.get(s) else [x]
                size = xs[j] + (ss[j] if len(unit) == 2 else 0)
                nb = near[j]
            else:
                s = ("S", j)
                if s not in res or pins.get(s):
                    continue
                unit, size, nb = [s], ss[j], ins[j]
            if size <= 0:
                continue
            if ev.isdisjoint(nb):   # the common case: a one-layer recompute
                cost = fwd[j]
            else:
                roots = {self._find(k) for k in nb if k in ev}
                if 1 + sum(len(self.members[r]) for r in roots) > limit:
                    continue   # never evicted: its recompute chain would be too long
                cost = fwd[j] + sum(self.class_ms[r] for r in roots)
            h = score(cost, size, clock - res[unit[0]] + 1e-3)
            if best_h is None or h < best_h:
                best, best_h = unit, h
        return best

    def victim(self) -> list[Tensor] | None:
        pool = self.pool
        n = len(pool)
        if n <= self.sample:
            return self.best(list(pool))
        rnd = self.rng.random   # uniform draws, with replacement (a repeat is harmless)
        picked = self.best([pool[int(rnd() * n)] for _ in range(self.sample)])
        if picked is None:   # none in the sample can go: look at all of them before giving up
            self.full_scans += 1
            picked = self.best(list(pool))
        return picked

    def make_room(self, need: int, step: Step) -> None:
        while self.level + need > self.cap and self.reason is None:
            unit = self.victim()
            if unit is None:
                if self.reason is None:
                    self.reason = "after evicting every evictable tensor, " + replay.shortfall(
                        self.g, step, self.level + need - self.cap, self.cap)
                return
            for t in unit:
                self.free(t)
            self.evictions += 1

    def free(self, t: Tensor) -> None:
        res = self.resident
        del res[t]
        self.level -= self.g.size(t)
        self.ops.append(Free(t))
        j = t[1]
        if t[0] != "G" and j in self.slot and ("X", j) not in res and ("S", j) not in res:
            self._drop(j)
        if t[0] == "X" and j and self.horizon[j] > self.pos:
            # evicted, or freed while a consumer's output may still be recomputed
            # through it: part of the evicted neighbourhoods until then
            self.mark_evicted(j)

    def compute(self, step: Step) -> None:
        """Run a route step, first recomputing what it needs that is missing."""
        needs = self.g.needs(step)
        self.pin(needs)
        missing = [t[1] for t in needs if t not in self.resident]
        if missing:
            self.remat(missing)
        self._run(step)
        self.unpin(needs)

    def _run(self, step: Step) -> None:
        g = self.g
        needs, allocs = g.needs(step), g.allocs(step)
        self.pin(allocs)
        new = [t for t in allocs if t not in self.resident]
        self.make_room(sum(g.size(t) for t in new) + g.workspace_bytes(step), step)
        self.ops.append(Compute(*step))
        self.clock += g.step_ms(step)
        for t in new:
            self.level += g.size(t)
            if t[0] != "G" and t[1] != 0:
                self._add(t[1])
                if t[0] == "X":
                    self.unmark_evicted(t[1])
        res = self.resident
        clock = self.clock
        for t in needs:
            res[t] = clock
        for t in new:
            res[t] = clock
        self.unpin(allocs)

    def remat(self, layers: list[int]) -> None:
        """Recompute ``layers`` and, through inputs that are not resident,
        their ancestors, in forward order (iteratively: chains can be long).
        Each recomputed input is pinned until its last consumer in the chain
        has run, then freed if the route no longer needs it."""
        g, res = self.g, self.resident
        todo: set[int] = set()
        stack = list(layers)
        while stack:
            j = stack.pop()
            if j in todo:
                continue
            todo.add(j)
            stack.extend(x for x in g.layers[j].inputs if ("X", x) not in res)
        order = sorted(todo)
        chain_in = [tuple(dict.fromkeys(g.layers[j].inputs)) for j in order]
        users: dict[int, int] = {}
        for ins in chain_in:
            for x in ins:
                users[x] = users.get(x, 0) + 1
        self.pin([("X", x) for x, k in users.items() if x not in todo for _ in range(k)])
        last = g.last_use
        for j, ins in zip(order, chain_in):
            self._run(("R", j))
            self.pin([("X", j)] * users.get(j, 0))
            for u in [("X", x) for x in ins] + [t for t in g.allocs(("R", j)) if t[0] == "S"]:
                if u[0] == "X":
                    self.unpin([u])
                if u in res and not self.pins.get(u) and last.get(u, -1) < self.pos \
                        and not (self.keep_data and g.layers[u[1]].kind == "data"):
                    self.free(u)


def plan_dtr_ops(graph: Graph, capacity: int, heuristic: str = "dtr", sample: int = SAMPLE,
                 chain: int = CHAIN, planner: type[Planner] = Planner
                 ) -> tuple[list[Op], dict, str | None]:
    """DTR's ops under ``capacity`` with eviction score ``heuristic`` (:data:`HEURISTICS`),
    scoring ``sample`` candidates per eviction (``planner``: a :class:`Planner` subclass)."""
    try:
        score = HEURISTICS[heuristic]
    except KeyError:
        raise ValueError(f"unknown DTR heuristic {heuristic!r}; choose from "
                         + ", ".join(HEURISTICS)) from None
    d = _run_route(graph, capacity, score, sample, chain, planner, keep_data=False)
    data = {i for i, layer in enumerate(graph.layers) if layer.kind == "data"}
    if any(type(op) is Compute and op.phase == "R" and op.layer in data for op in d.ops):
        # the input cannot be recomputed (it is read from the host): keep it instead
        d = _run_route(graph, capacity, score, sample, chain, planner, keep_data=True)
    return d.ops, {"evictions": d.evictions, "full_scans": d.full_scans}, d.reason


def _run_route(graph: Graph, capacity: int, score: Heuristic, sample: int, chain: int,
               planner: type[Planner], keep_data: bool) -> Planner:
    d = planner(graph, capacity, score, sample, chain)
    d.keep_data = keep_data
    _, frees = sequences.use_positions(graph, graph.route)
    kept = []
    for p, step in enumerate(graph.route):
        d.pos = p
        d.compute(step)
        for t in frees[p]:
            if keep_data and t[0] == "X" and graph.layers[t[1]].kind == "data":
                kept.append(t)
            elif t in d.resident:
                d.free(t)
        for j in d.expiry.pop(p, ()):
            d.unmark_evicted(j)   # nothing left to recompute through it: out of its class
    for t in kept:
        if t in d.resident:
            d.free(t)
    return d


@register("dtr", "dynamic eviction by cost/(size x staleness), recompute on demand", order=70)
def plan_dtr(ctx: PlanContext) -> Schedule:
    ops, stats, reason = plan_dtr_ops(ctx.graph, ctx.capacity_bytes)
    return finishing.finish("dtr", ctx.graph, ops, ctx.budget_bytes, stats, reason)
