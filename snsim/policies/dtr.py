"""``dtr``: Dynamic Tensor Rematerialization (Kirisame et al., ICLR 2021).

Replays the route under the budget the way DTR's runtime does (simrd's
``RuntimeV2EagerOptimized``, the paper's simulated evaluation):

- *eager eviction*: a tensor leaves the device when the program no longer
  references it (liveness frees; on an op-log trace its release point,
  docs/DESIGN.md "Op-log traces"), and it stays part of the evicted
  neighbourhoods while a recompute may still pass through it;
- when an allocation does not fit, the resident tensor with the smallest
  ``h = cost / (size x staleness)`` is evicted, every evictable tensor
  scored (simrd scans its whole pool; a tensor without bytes is never a
  candidate, since evicting it frees nothing);
- a step that needs an evicted tensor recomputes it on demand (``R``
  steps), through evicted or freed inputs back to resident ones; what a
  recompute makes stays resident (and evictable), as in simrd; recomputing
  an op re-makes all its results (the resident ones in place; a layer's
  output beside evicted saved extras is freed first and re-made with them);
- *thrash limit*: once recomputation exceeds ``(thrash_limit - 1) x`` the
  route's compute time the run is infeasible (simrd aborts past 2x).  It is
  declared as soon as it is certain: when the recomputation so far plus the
  forward time of every evicted layer that a later route step still reads
  (each must be recomputed at least once; "owed") exceeds the limit;
- once infeasible, no more evictions: the rest of the route is issued
  without a budget, so the schedule stays whole (it was planned to the end
  with evictions before, 649 s on an LSTM log).

An op's results (``output_sizes``) and saved extras are separate tensors,
each evicted on its own, as simrd's storages are; a view (``alias_of``) is
pinned and evicted with its storage.  ``staleness`` is the planned compute
time since the tensor was last read or made: a route step's inputs are
stamped when the step begins (before what it needs is recomputed), its
results after it; what is recomputed for the step, inputs and results, also
carries the step's start (simrd stamps an op's inputs when it begins to make
them ready and never stamps a recompute's results, so along a linear chain its
stamps are exactly these); a staleness of zero scores ``inf``.

``cost`` is DTR's evicted neighbourhood e*: the layer's own forward time
plus that of every evicted layer connected to it through evicted layers
(inputs and consumers: both sides), kept as union-find classes over the
evicted layers (:mod:`snsim.policies.dtr_pool`).  A class of at most
``SPLIT_MAX`` (256) members that loses one is rebuilt into its components,
so the cost is the exact component's; a larger one only loses the member's
time and stays joined through it (simrd's ``eq_class`` approximation): an
over-estimate, on deep traces only.  simrd sums evicted ancestors and, apart,
evicted descendants; a component also holds layers reached up and down again,
so its cost is at least simrd's.  On an op-log (forward-only) trace a
released layer stays in the classes for good, as in simrd
(``keep_released``); on a trace with a backward pass it leaves them once
nothing can be recomputed through it.  ``chain`` (default: none) caps a
neighbourhood's layers; a candidate beyond it has infinite cost.

Every candidate is scored (simrd's full scan) while at most ``FULL_SCAN``
(2,048) tensors are resident candidates; beyond, ``sample`` (256) drawn
uniformly (numpy, seeded), as DTR's prototype samples.  Both are a branch
and bound with the same choice as scoring every candidate (the smallest
score; of equal ones the highest pool slot, or the last drawn): every
candidate's score is bounded below in one numpy pass from a cached cost (its
last exact cost, reset to its own time when a class next to it may have lost
more than a member's time), and only candidates whose bound does not exceed
the best exact score so far are scored exactly (``tests/test_dtr.py`` checks
every choice against a brute-force scorer on random graphs and ResNet-50, the
sampled choice against a scan of the sample, and that the cached bounds stay
below the true scores; the bound needs a score non-decreasing in the cost,
as all of these are).  The eviction score
is pluggable (:data:`HEURISTICS`): ``dtr``, ``lru`` (1 / staleness),
``size`` (1 / size) and ``msps`` (cost / size).  The smallest is evicted.
The data layer's output is never evicted; where a recomputation would
still need it after its last use, the plan is made again with it kept to the
end of the route (the input is read from the host, never recomputed).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from snsim.graph import Graph, Step, Tensor
from snsim.policies import register
from snsim.policies import finishing
from snsim.policies import replay
from snsim.policies import sequences
from snsim.policies.base import PlanContext
from snsim.policies.dtr_choose import Chooser
from snsim.policies.dtr_pool import Classes, Pool
from snsim.schedule.ops import Compute, Free, Op, Schedule

# simrd's overhead limit: recomputation may add at most (THRASH - 1) x compute
THRASH = 2.0
# Every candidate is scored while at most FULL_SCAN layers hold one (every cell of
# the simrd corpus: at most 1,159); beyond, SAMPLE drawn uniformly, so that an
# eviction's cost stays bounded and planning linear in the route.
FULL_SCAN = 2048
SAMPLE = 256
# At most RESCORE exact scores beyond the bound per eviction (None: all, the full
# scan's choice).  An approximation kept for experiments; off by default.
RESCORE = None

# score(cost_ms, size_bytes, staleness_ms) -> float; the smallest is evicted.
Heuristic = Callable[[float, int, float], float]
HEURISTICS: dict[str, Heuristic] = {
    "dtr": lambda cost, size, stale: cost / (size * stale),
    "lru": lambda cost, size, stale: 1.0 / stale,
    "size": lambda cost, size, stale: 1.0 / size,
    "msps": lambda cost, size, stale: cost / size,
}


class Planner(Chooser):
    """DTR's replay of the route; :func:`plan_dtr_ops` runs it.

    State a scorer may read: ``resident`` (tensor -> last access, ms),
    ``pins`` (tensor -> pin count), ``evicted`` (layers whose output was
    evicted and not yet recomputed), ``clock`` (ms) and ``pos`` (route index).
    """

    def __init__(self, graph: Graph, capacity: int, score: Heuristic,
                 sample: int | None = SAMPLE, chain: int | None = None, seed: int = 0,
                 thrash_limit: float = THRASH, keep_remat: bool = True,
                 full_scan: int = FULL_SCAN, keep_released: bool | None = None):
        self.g, self.cap, self.score, self.sample = graph, capacity, score, sample
        self.full_scan = full_scan
        self.chain = math.inf if chain is None else chain
        self.level = graph.trace.static_bytes
        self.resident: dict[Tensor, float] = {}   # tensor -> last access (ms)
        self.pins: dict[Tensor, int] = {}
        self.ops: list[Op] = []
        self.clock = 0.0
        self.pos = 0
        self.entry = 0.0   # clock when the route step under way began (its stamp)
        self.reason: str | None = None
        self.evictions = 0
        self.remat_ms = 0.0
        self.keep_data = False        # the data layer's output stays to the end
        self.kept_data: set[Tensor] = set()
        self.infeasible: str | None = None
        self.keep_remat = keep_remat
        self.remat_limit_ms = (thrash_limit - 1.0) * graph.compute_ms
        # layers the route must still recompute: an evicted tensor that a later
        # route step reads (count per layer) and their summed forward ms, a lower
        # bound of the recomputation to come (the early thrash test)
        self.owed: dict[int, int] = {}
        self.owed_ms = 0.0
        self.last_use = graph.last_use
        self.rng = np.random.default_rng(seed)
        self.inputs = [tuple(dict.fromkeys(layer.inputs)) for layer in graph.layers]
        self.fwd = [layer.fwd_ms for layer in graph.layers]
        self.consumers = [tuple(c) for c in graph.consumers]
        self.near = [i + c for i, c in zip(self.inputs, self.consumers)]
        size = graph.size
        # per layer, the tensors eviction may take (with bytes; never the data layer's)
        self.cands: list[tuple[Tensor, ...]] = [()] + [
            tuple(t for t in graph.allocs(("F", j)) if size(t) > 0) for j in range(1, graph.n)]
        self.nbytes = {t: size(t) for ts in self.cands for t in ts}
        self.pool = Pool(len(self.nbytes))   # the resident ones, for the scan
        self.in_pool = [0] * graph.n         # per layer, its tensors in the pool
        self.rescored = 0                    # evictions that scored beyond the bound
        self.rescore = RESCORE
        self.with_extras = frozenset(j for j in range(1, graph.n)
                                     if graph.layers[j].saved_extra_bytes
                                     and j not in graph.multi_result)
        # a view's storage: pinned with the view, and the view goes when it is evicted
        self.storage: dict[Tensor, tuple[Tensor, ...]] = {}
        for layer in graph.layers:
            for j, k in layer.extra.get("alias_of", ()):
                t = graph.read(j, k)
                if t is not None:
                    base = (t,) + self.storage.get(t, ())
                    self.storage[("X", layer.id)] = self.storage.get(("X", layer.id), ()) + base
        self.views = graph.views
        # the evicted neighbourhoods (union-find classes over the evicted layers)
        self.classes = Classes(self.near, self.fwd, self.lowered, self.scored)
        self.evicted = self.classes.evicted
        # route index after which a freed X_j leaves the evicted neighbourhoods.  On
        # an op log (forward-only): never, as in simrd, where a released tensor stays
        # evicted, and counts, for good.  Otherwise once nothing can be recomputed
        # through it: the last use of X_j or of a consumer's output.
        if keep_released is None:
            keep_released = bool(graph.trace.source.get("forward_only"))
        if keep_released:
            self.horizon = [math.inf] * graph.n
        else:
            last = graph.last_use
            self.horizon = [max([last.get(("X", j), -1)]
                                + [last.get(("X", c), -1) for c in graph.consumers[j]])
                            for j in range(graph.n)]
        self.expiry: dict[int, list[int]] = {}   # route index -> layers leaving ``evicted``

    def pin(self, ts) -> None:
        pins, storage, slot, P = self.pins, self.storage, self.pool.slot, self.pool.P
        for t in ts:
            for u in (t,) + storage.get(t, ()):
                c = pins.get(u, 0)
                pins[u] = c + 1
                if not c and u in slot:
                    P[slot[u]] = math.inf

    def unpin(self, ts) -> None:
        pins, storage, slot, P = self.pins, self.storage, self.pool.slot, self.pool.P
        for t in ts:
            for u in (t,) + storage.get(t, ()):
                c = pins[u] - 1
                pins[u] = c
                if not c and u in slot:
                    P[slot[u]] = 0.0

    def mark_evicted(self, j: int) -> None:
        """X_j leaves the device: it joins (and merges) its evicted neighbours' classes."""
        if j not in self.classes.evicted:
            self.classes.add(j)
            self.expiry.setdefault(self.horizon[j], []).append(j)

    def unmark_evicted(self, j: int) -> None:
        """X_j is back (recomputed) or no longer needed: out of its class."""
        self.classes.remove(j)

    def cost(self, j: int, nb) -> float:
        """Forward time of layer j plus that of every evicted class next to it
        through ``nb`` (its inputs and consumers, or only its inputs for saved
        extras); ``inf`` if together they have more than ``chain`` layers."""
        ms, members = self.classes.cost(j, nb)
        if members and 1 + members > self.chain:
            return math.inf
        return self.fwd[j] + ms

    def scored(self, j: int) -> bool:
        return self.in_pool[j] > 0

    def lowered(self, layers, by: float | None) -> None:
        """The neighbourhood cost of ``layers``' tensors dropped by up to all of it
        (``by`` None), or every tensor's by up to ``by`` ms: the cached lower
        bounds follow."""
        pool = self.pool
        if by is not None:
            pool.drop_all(by)
            return
        cands, slot = self.cands, pool.slot
        for k in layers:
            for t in cands[k]:
                if t in slot:
                    pool.reset(slot[t])

    def make_room(self, need: int, step: Step) -> None:
        while self.level + need > self.cap and self.reason is None:
            t = self.victim()
            if t is None:
                left = len(self.pool)
                self.reason = (f"with {left} resident tensors pinned by the step, "
                               if left else "after evicting every evictable tensor, ") \
                    + replay.shortfall(self.g, step, self.level + need - self.cap, self.cap)
                return
            self.free(t)
            self.evictions += 1
            if self.remat_ms + self.owed_ms * (1.0 - 1e-9) > self.remat_limit_ms:
                self.reason = (
                    f"thrashing: recomputation {self.remat_ms:.3f} ms so far plus at least "
                    f"{self.owed_ms:.3f} ms owed (evicted tensors the route still reads) "
                    f"exceeds {self.remat_limit_ms:.3f} ms, (limit - 1) x the compute")
                return

    def free(self, t: Tensor) -> None:
        if self.keep_data and t[0] == "X" and self.g.layers[t[1]].kind == "data":
            self.kept_data.add(t)   # freed at the end of the route (plan_dtr_ops)
            return
        res = self.resident
        del res[t]
        self.level -= self.g.size(t)
        self.ops.append(Free(t))
        j = t[1]
        if self.last_use.get(t, -1) > self.pos:   # a later route step reads it: owed
            c = self.owed.get(j, 0)
            self.owed[j] = c + 1
            if not c:
                self.owed_ms += self.fwd[j]
        if t in self.pool.slot:
            self.pool.drop(t)
            self.in_pool[j] -= 1
        if t[0] not in ("S", "G", "P"):
            for v in self.views[j]:   # a view goes with its storage
                if ("X", v) in res:
                    self.free(("X", v))
            if t[0] == "X" and j and self.horizon[j] > self.pos:
                # evicted, or freed while a consumer's output may still be recomputed
                # through it: part of the evicted neighbourhoods until then
                self.mark_evicted(j)

    def compute(self, step: Step) -> None:
        """Run a route step, first recomputing what it needs that is missing."""
        needs = self.g.needs(step)
        self.entry = self.clock   # what this step's recomputes read is stamped now
        self.pin(needs)
        missing = [t for t in needs if t not in self.resident]
        if missing:
            self.remat(missing)
        if self.reason is None:
            self._run(step)
        if self.reason is None:   # else planning stops here, pins and all
            self.unpin(needs)

    def _run(self, step: Step) -> None:
        g = self.g
        needs, allocs = g.needs(step), g.allocs(step)
        self.pin(allocs)
        res = self.resident
        new = [t for t in allocs if t not in res]
        born = g.param_grad_bytes(step)   # set-to-none: resident from here on
        self.make_room(sum(g.size(t) for t in new) + born + g.workspace_bytes(step), step)
        if self.reason is not None:
            self.unpin(allocs)
            return
        self.ops.append(Compute(*step))
        ms = g.step_ms(step)
        self.clock += ms
        self.level += born
        if step[0] == "R":
            self.remat_ms += ms
            if self.owed.pop(step[1], 0):
                self.owed_ms -= self.fwd[step[1]]
        pool, nbytes, fwd, pins = self.pool, self.nbytes, self.fwd, self.pins
        clock = self.clock
        for t in new:
            self.level += g.size(t)
            if t in nbytes:
                pool.add(t, clock, fwd[t[1]], nbytes[t], bool(pins.get(t)))
                self.in_pool[t[1]] += 1
            if t[0] == "X":
                self.unmark_evicted(t[1])
        slot, A = pool.slot, pool.A
        # simrd stamps an op's inputs when it begins to make them ready, before
        # recomputing any of them, and a recompute does not stamp its results: a
        # step's inputs, and all that is recomputed for it, carry the clock at
        # the step's start (exactly simrd's stamps along a linear chain)
        before = self.entry
        if step[0] == "R":
            clock = before
        for t in needs:
            res[t] = before
            if t in slot:
                A[slot[t]] = before
        for t in allocs:
            res[t] = clock
            if t in slot:
                A[slot[t]] = clock
        self.unpin(allocs)

    def remat(self, missing: list[Tensor]) -> None:
        """Recompute the layers that make ``missing`` and, through inputs that are
        not resident, their ancestors, in forward order (iteratively: chains can
        be long).  The chain's inputs from outside it are pinned for the whole
        chain, each recomputed tensor until its last consumer in the chain has
        run; what the chain made then stays resident, evictable (simrd), unless
        ``keep_remat`` is off and the route no longer needs it."""
        g, res = self.g, self.resident
        todo: set[int] = set()
        stack = [t[1] for t in missing]
        while stack:
            j = stack.pop()
            if j in todo:
                continue
            todo.add(j)
            stack.extend(t[1] for t in g.needs(("R", j)) if t not in res)
        order = sorted(todo)
        chain_in = [g.needs(("R", j)) for j in order]
        users: dict[Tensor, int] = {}
        by_layer: dict[int, list[Tensor]] = {}
        for ins in chain_in:
            for t in ins:
                if t not in users:
                    by_layer.setdefault(t[1], []).append(t)
                users[t] = users.get(t, 0) + 1
        self.pin([t for t, k in users.items() if t[1] not in todo for _ in range(k)])
        last = g.last_use
        for j, ins in zip(order, chain_in):
            x = ("X", j)
            if x in res and j in self.with_extras:
                # saved extras evicted alone: the output goes too, the recompute
                # re-makes both (an output is re-made in place only for an op with
                # several results, docs/DESIGN.md "Op-log traces")
                self.free(x)
            self._run(("R", j))
            if self.reason is not None:
                return
            self.pin([t for t in by_layer.get(j, ()) for _ in range(users[t])])
            self.unpin(ins)
            if not self.keep_remat:
                for t in ins:
                    if t in res and not self.pins.get(t) and last.get(t, -1) < self.pos:
                        self.free(t)
            if self.remat_ms > self.remat_limit_ms:
                self.reason = (f"thrashing: recomputation {self.remat_ms:.3f} ms exceeds "
                               f"{self.remat_limit_ms:.3f} ms, (limit - 1) x the compute")
                return


def plan_dtr_ops(graph: Graph, capacity: int, heuristic: str = "dtr",
                 sample: int | None = SAMPLE, chain: int | None = None,
                 planner: type[Planner] = Planner, thrash_limit: float = THRASH
                 ) -> tuple[list[Op], dict, str | None]:
    """DTR's ops under ``capacity`` with eviction score ``heuristic`` (:data:`HEURISTICS`);
    ``sample`` candidates per eviction beyond :data:`FULL_SCAN` (None: all of
    them always), ``planner`` a
    :class:`Planner` subclass.  Eviction stops at the first step that cannot
    run (the reason says which): the rest of the route follows without a
    budget, recomputing what is missing, in one linear pass."""
    try:
        score = HEURISTICS[heuristic]
    except KeyError:
        raise ValueError(f"unknown DTR heuristic {heuristic!r}; choose from "
                         + ", ".join(HEURISTICS)) from None
    if not thrash_limit > 1.0:
        raise ValueError(f"thrash limit must be above 1.0, got {thrash_limit}")
    d = _run_route(graph, planner(graph, capacity, score, sample, chain,
                                  thrash_limit=thrash_limit))
    data = {i for i, layer in enumerate(graph.layers) if layer.kind == "data"}
    if any(type(op) is Compute and op.phase == "R" and op.layer in data for op in d.ops):
        # the input cannot be recomputed (it is read from the host): keep it to the end
        d = planner(graph, capacity, score, sample, chain, thrash_limit=thrash_limit)
        d.keep_data = True
        d = _run_route(graph, d)
    stats = {"evictions": d.evictions, "remat_ms": round(d.remat_ms, 6)}
    return d.ops, stats, d.infeasible


def _run_route(graph: Graph, d: Planner) -> Planner:
    _, frees = sequences.use_positions(graph, graph.route)
    reason = None
    for p, step in enumerate(graph.route):
        d.pos = p
        d.compute(step)
        if d.reason is not None and reason is None:
            # Infeasible: no more eviction decisions.  The rest of the route is
            # issued as it comes, missing inputs recomputed, without a budget,
            # so the schedule stays whole (the executor and validate can run it)
            # and the rest costs one linear pass.
            reason, d.reason = d.reason, None
            d.cap, d.remat_limit_ms, d.pins = math.inf, math.inf, {}
            d.compute(step)
        for t in frees[p]:
            if t in d.resident:
                d.free(t)
        for j in d.expiry.pop(p, ()):
            d.unmark_evicted(j)   # nothing left to recompute through it: out of its class
    d.keep_data = False
    for t in sorted(d.kept_data):
        if t in d.resident:
            d.free(t)
    d.infeasible = reason
    return d


@register("dtr", "dynamic eviction by cost/(size x staleness), recompute on demand", order=70)
def plan_dtr(ctx: PlanContext) -> Schedule:
    ops, stats, reason = plan_dtr_ops(ctx.graph, ctx.capacity_bytes,
                                      thrash_limit=ctx.thrash_limit)
    return finishing.finish("dtr", ctx.graph, ops, ctx.budget_bytes, stats, reason)
