"""``dtr``: Dynamic Tensor Rematerialization (Kirisame et al., ICLR 2021).

Replays the route under the budget the way DTR's runtime would: liveness
frees what the route no longer needs; when an allocation does not fit, the
resident forward result (output and saved extras of one layer) with the
smallest ``h = cost / (size x staleness)`` is evicted, and a step that needs
an evicted tensor recomputes it on demand (``R`` steps), through evicted or
freed inputs back to resident ones; temporaries made only to recompute are
freed as soon as their last consumer in the chain has run.  ``cost`` is the
forward time to recompute the layer from resident tensors (its own plus,
recursively, that of missing inputs: DTR's evicted neighbourhood e*, without
its union-find approximation); ``staleness`` is the planned compute time
since the tensor was last used.  Each eviction scans the ``SAMPLE`` stalest
evictable tensors (a deterministic sample; the prototype samples too), and
a tensor whose recomputation would re-run more than ``CHAIN`` layers is not
a candidate.
Gradients and the data layer's output are never evicted; where a
recomputation would still need the data after its last use, the plan is
made again with the data kept to the end (the input is not recomputable).  Without a budget
tighter than the liveness peak nothing is evicted: the plan is liveness.

The eviction score is pluggable (:data:`HEURISTICS`, ``plan_dtr_ops(...,
heuristic=name)``), as DTR's paper compares several: ``dtr`` (the policy's
own, cost / (size x staleness)), ``lru`` (1 / staleness), ``size`` (1 /
size: the largest first) and ``msps`` (cost / size: memory saved per
second of recompute, no staleness).  The smallest score is evicted.
"""

from __future__ import annotations

import math
from typing import Callable

from snsim.graph import Graph, Step, Tensor
from snsim.policies import register
from snsim.policies import finishing
from snsim.policies import replay
from snsim.policies import sequences
from snsim.policies.base import PlanContext
from snsim.schedule.ops import Compute, Free, Op, Schedule


# Candidates scanned per eviction, stalest first (DTR's prototype also searches
# a sample rather than every resident tensor; all of them is quadratic).
SAMPLE = 32
# Tensors whose recomputation would re-run more layers than this are not evicted.
CHAIN = 8


# score(cost_ms, size_bytes, staleness_ms) -> float; the smallest is evicted.
Heuristic = Callable[[float, int, float], float]
HEURISTICS: dict[str, Heuristic] = {
    "dtr": lambda cost, size, stale: cost / (size * stale),
    "lru": lambda cost, size, stale: 1.0 / stale,
    "size": lambda cost, size, stale: 1.0 / size,
    "msps": lambda cost, size, stale: cost / size,
}


class _DTR:
    def __init__(self, graph: Graph, capacity: int, score: Heuristic):
        self.g, self.cap, self.score = graph, capacity, score
        self.level = graph.trace.static_bytes
        self.resident: dict[Tensor, float] = {}   # tensor -> last access (ms)
        self.pins: dict[Tensor, int] = {}
        self.ops: list[Op] = []
        self.clock = 0.0
        self.pos = 0
        self.reason: str | None = None
        self.evictions = 0
        self.keep_data = False   # the data layer's output stays to the end

    def pin(self, ts) -> None:
        for t in ts:
            self.pins[t] = self.pins.get(t, 0) + 1

    def unpin(self, ts) -> None:
        for t in ts:
            self.pins[t] -= 1

    def _victim(self):
        g, res, pins = self.g, self.resident, self.pins
        best, best_h = None, None
        memo: dict[int, float] = {}
        seen_n = 0
        for t, seen in res.items():   # stalest first
            if t[0] == "G" or t[1] == 0 or pins.get(t):
                continue
            seen_n += 1
            if seen_n > SAMPLE:
                break
            j = t[1]
            if t[0] == "S" and ("X", j) in res:
                continue   # saved extras go with their output (an R step remakes both)
            unit = [t]
            other = ("S", j)
            if t[0] == "X" and other in res and not pins.get(other):
                unit.append(other)
            size = sum(g.size(u) for u in unit)
            if size <= 0:
                continue
            cost = self._cost(j, memo)
            h = self.score(cost, size, self.clock - seen + 1e-3)
            if best_h is None or h < best_h:
                best, best_h = unit, h
        return best

    def _cost(self, j: int, memo: dict) -> float:
        # Forward time to recompute layer j from resident tensors: its own plus,
        # recursively, that of its missing inputs (DTR's evicted neighbourhood).
        # A neighbourhood over CHAIN layers counts as infinitely costly.
        layers, res = self.g.layers, self.resident
        c = memo.get(j)
        if c is not None:
            return c
        ins = layers[j].inputs
        if all(("X", x) in res for x in ins):   # the common case: a one-layer recompute
            c = memo[j] = layers[j].fwd_ms
            return c
        stack = [j]
        visited = 0
        while stack:
            k = stack[-1]
            if k in memo:
                stack.pop()
                continue
            visited += 1
            if visited > CHAIN:
                for x in stack:
                    memo[x] = math.inf
                return math.inf
            todo = [x for x in layers[k].inputs if ("X", x) not in res and x not in memo]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            memo[k] = layers[k].fwd_ms + sum(memo[x] for x in dict.fromkeys(layers[k].inputs)
                                             if ("X", x) not in res)
        return memo[j]

    def make_room(self, need: int, step: Step) -> None:
        while self.level + need > self.cap:
            unit = self._victim()
            if unit is None:
                if self.reason is None:
                    self.reason = "after evicting every evictable tensor, " + replay.shortfall(
                        self.g, step, self.level + need - self.cap, self.cap)
                return
            for t in unit:
                self.free(t)
            self.evictions += 1

    def free(self, t: Tensor) -> None:
        del self.resident[t]
        self.level -= self.g.size(t)
        self.ops.append(Free(t))

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
        res = self.resident
        for t in needs + tuple(new):
            res.pop(t, None)   # keep ``resident`` ordered stalest first
            res[t] = self.clock
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


def plan_dtr_ops(graph: Graph, capacity: int, heuristic: str = "dtr"
                 ) -> tuple[list[Op], dict, str | None]:
    """DTR's ops under ``capacity`` with eviction score ``heuristic`` (:data:`HEURISTICS`)."""
    try:
        score = HEURISTICS[heuristic]
    except KeyError:
        raise ValueError(f"unknown DTR heuristic {heuristic!r}; choose from "
                         + ", ".join(HEURISTICS)) from None
    d = _run_route(graph, capacity, score, keep_data=False)
    data = {i for i, layer in enumerate(graph.layers) if layer.kind == "data"}
    if any(type(op) is Compute and op.phase == "R" and op.layer in data for op in d.ops):
        # the input cannot be recomputed (it is read from the host): keep it instead
        d = _run_route(graph, capacity, score, keep_data=True)
    return d.ops, {"evictions": d.evictions}, d.reason


def _run_route(graph: Graph, capacity: int, score: Heuristic, keep_data: bool) -> _DTR:
    d = _DTR(graph, capacity, score)
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
    for t in kept:
        if t in d.resident:
            d.free(t)
    return d


@register("dtr", "dynamic eviction by cost/(size x staleness), recompute on demand", order=70)
def plan_dtr(ctx: PlanContext) -> Schedule:
    ops, stats, reason = plan_dtr_ops(ctx.graph, ctx.capacity_bytes)
    return finishing.finish("dtr", ctx.graph, ops, ctx.budget_bytes, stats, reason)
