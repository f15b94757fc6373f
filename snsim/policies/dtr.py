"""``dtr``: Dynamic Tensor Rematerialization (Kirisame et al., ICLR 2021).

Replays the route under the budget the way DTR's runtime does (simrd's
``RuntimeV2EagerOptimized`` with its ``DTR()`` heuristic, the paper's
simulated evaluation; on the authors' op logs the same recomputations, to the
nanosecond, validate/report-dtr-simrd/):

- *eager eviction*: a tensor leaves the device when the program no longer
  references it (liveness frees; on an op-log trace its release point,
  docs/DESIGN.md "Op-log traces"), and it stays part of the evicted
  neighbourhoods while a recompute may still pass through it; a view the
  program drops while its storage is resident stays (simrd's alias tensor
  stays defined until its storage goes);
- when an allocation does not fit, the resident tensor with the smallest
  ``h = cost / (size x staleness)`` is evicted, every evictable tensor
  scored (simrd scans its whole pool; a tensor without bytes is never a
  candidate, since evicting it frees nothing); of equal scores the one that
  became evictable last (simrd's pool order);
- *recursive rematerialization* (simrd's ``_materialize``, the paper's
  algorithm): a step stamps its inputs, pins the resident ones, then makes
  each missing one in turn, depth first (the op that made it, which does the
  same for its own inputs), pinning it once it is there; then it makes room
  and runs.  Only the inputs of the frames under way are pinned.  What a
  recompute makes stays resident (and evictable).  A recompute makes room for
  all of its op's results and re-makes the resident ones in place (simrd's
  ``total_size``); a layer's output beside evicted saved extras is freed
  first and re-made with them;
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
time since the tensor's storage was last stamped: a step's inputs when its
frame begins (a view's read stamps its storage), a route step's results when
it ends; a recompute's results keep the stamp they had (simrd never stamps
them); a staleness of zero scores ``inf``.

``cost`` is DTR's evicted neighbourhood e*, as simrd's two regions: the
tensor's own time plus that of every evicted storage reached upwards through
evicted storages (what recomputing it would need) and downwards (what would
need it), over storage nodes (:attr:`Planner.node_of`): one per layer's
output (with its saved extras), one per other result, a view joined to its
storage's node (its op's time added, as simrd's storage compute sums its
tensors' ops).  Searched when a candidate is scored exactly; when an evicted
storage comes back, a search from it finds the candidates whose regions held
it, whose cached bounds drop by the most they can lose.  On an
op-log (forward-only) trace a released storage stays evicted for good, as in
simrd (``keep_released``); on a trace with a backward pass it leaves the
neighbourhoods once nothing can be recomputed through it.  ``chain``
(default: none) caps a neighbourhood's storages; a candidate beyond it has
infinite cost.

Every candidate is scored (simrd's full scan) while at most ``FULL_SCAN``
(8,192) tensors are resident candidates; beyond, ``sample`` (256) drawn
uniformly (numpy, seeded), as DTR's prototype samples.  Both are a branch
and bound with the same choice as scoring every candidate: every
candidate's score is bounded below in one numpy pass from a cached cost (the
larger of its last exact cost, lowered when an evicted storage in its regions
comes back: regions only grow otherwise, and its own time plus its evicted
neighbours', kept up to date on every eviction and return), and only
candidates whose bound does not exceed the best exact score so far are
scored exactly.  The first exact score is found best first (the smallest
bound's search is cut at the next bound and its bound raised, until the
smallest bound is a score), and every later search stops once its candidate
is certain to lose.  Within one ``make_room`` the clock stands still and
evictions only raise scores, so one choice's bounds (raised where scored)
serve the next.  Lowering cached bounds after recomputations that would
search more than ``SETTLE_LIMIT`` evicted storages upwards (``SETTLE_DOWN``
downwards) drops them to the neighbours' bound instead (deep in thrashing
every recomputation would search the network again: ResNet-2500 at 1.05x,
23k evictions, 13 s -> 3.7 s, the same choices)
(``tests/test_dtr.py`` checks every choice against a brute-force scorer on
random graphs and ResNet-50, the recomputations against simrd's runtime
restated plainly on random op logs, the sampled choice against a scan of the
sample, and that the cached bounds stay below the true scores; the bound
needs a score non-decreasing in the cost, as all of these are).  The
eviction score is pluggable (:data:`HEURISTICS`): ``dtr``, ``lru`` (1 /
staleness), ``size`` (1 / size) and ``msps`` (cost / size).  The smallest is
evicted.  The data layer's output is never evicted; where a recomputation
would still need it after its last use, the plan is made again with it kept
to the end of the route (the input is read from the host, never recomputed).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from snsim.graph import Graph, Step, Tensor, kind
from snsim.policies import register
from snsim.policies import finishing
from snsim.policies import replay
from snsim.policies import sequences
from snsim.policies.base import PlanContext
from snsim.policies.dtr_choose import Chooser
from snsim.policies.dtr_pool import Pool, StorageNodes
from snsim.schedule.ops import Op, Schedule

# simrd's overhead limit: recomputation may add at most (THRASH - 1) x compute
THRASH = 2.0
# Every candidate is scored while at most FULL_SCAN layers hold one (every cell of
# the simrd corpus: at most 1,159; every trace of benchmarks/bench_scaling.py, up
# to 32k layers); beyond, SAMPLE drawn uniformly, so that an eviction's cost stays
# bounded and planning linear in the route.  A sampled choice costs more than a
# scan's (a fresh bound per pick, no bounds kept across one make_room, ~4.6 exact
# searches against ~2): at 2,048, ResNet-2500 at 1.05x sampled 8k of its 23k
# evictions at 153 us each against 54 us scanned, and planned in 1.3x the time.
FULL_SCAN = 8192
SAMPLE = 256
# At most RESCORE exact scores beyond the bound per eviction (None: all, the full
# scan's choice).  An approximation kept for experiments; off by default.
RESCORE = None

# A settle (lowering cached bounds after recomputations) searches at most this
# many evicted nodes upwards, SETTLE_DOWN downwards; beyond, cached bounds fall
# back to the neighbours'.  Deep in thrashing the downward search is the one that
# walks long evicted chains: 64 there takes 2.3% fewer instructions than 256 on
# ResNet-2500 at 1.05x (0.7% at 1.5x), 32 or 128 fewer than 256 but more than 64.
SETTLE_LIMIT = 256
SETTLE_DOWN = 64

# a node's tag while it is not evicted: above every walk number (cost's searches)
NOT_EVICTED = 1 << 62

# score(cost_ms, size_bytes, staleness_ms) -> float; the smallest is evicted.
Heuristic = Callable[[float, int, float], float]
HEURISTICS: dict[str, Heuristic] = {
    "dtr": lambda cost, size, stale: cost / (size * stale),
    "lru": lambda cost, size, stale: 1.0 / stale,
    "size": lambda cost, size, stale: 1.0 / size,
    "msps": lambda cost, size, stale: cost / size,
}
# per heuristic whose score grows with the cost: the cost at which a candidate of
# that size and staleness scores ``h`` (a search for its cost may stop beyond it)
COST_AT: dict[Heuristic, Callable[[float, float, float], float]] = {
    HEURISTICS["dtr"]: lambda h, size, stale: h * size * stale,
    HEURISTICS["msps"]: lambda h, size, stale: h * size,
}


class Planner(Chooser):
    """DTR's replay of the route; :func:`plan_dtr_ops` runs it.

    State a scorer may read: ``resident`` (tensor -> last access, ms),
    ``pins`` (tensor -> pin count), ``evicted`` (storage nodes evicted and not
    yet recomputed; on a trace without views or several results per op, a
    node is a layer), ``clock`` (ms) and ``pos`` (route index).
    """

    def __init__(self, graph: Graph, capacity: int, score: Heuristic,
                 sample: int | None = SAMPLE, chain: int | None = None, seed: int = 0,
                 thrash_limit: float = THRASH,
                 full_scan: int = FULL_SCAN, keep_released: bool | None = None,
                 settle_limit: int | None = None):
        self.g, self.cap, self.score, self.sample = graph, capacity, score, sample
        self.full_scan = full_scan
        self.chain = math.inf if chain is None else chain
        self.level = graph.trace.static_bytes
        self.resident: dict[Tensor, float] = {}   # tensor -> last access (ms)
        self.pins: dict[Tensor, int] = {}
        self.ops: list[Op] = []
        self.clock = 0.0
        self.pos = 0
        # the last stamp of each tensor that is not resident (simrd keeps it on the
        # evicted storage; a recompute's results get theirs back)
        self.stamps: dict[Tensor, float] = {}
        self.reason: str | None = None
        self.evictions = 0
        self.remat_ms = 0.0
        self.keep_data = False        # the data layer's output stays to the end
        self.data_layers = frozenset(i for i, layer in enumerate(graph.layers)
                                     if layer.kind == "data")
        self.remade_data = False      # a data layer recomputed: plan again, keeping it
        self.kept_data: set[Tensor] = set()
        self.infeasible: str | None = None
        self.remat_limit_ms = (thrash_limit - 1.0) * graph.compute_ms
        # layers the route must still recompute: an evicted tensor that a later
        # route step reads (count per layer) and their summed forward ms, a lower
        # bound of the recomputation to come (the early thrash test)
        self.owed: dict[int, int] = {}
        self.owed_ms = 0.0
        self.last_use = graph.last_use
        self.rng = np.random.default_rng(seed)
        self.fwd = graph.plain_ms["F"]   # read only
        # a view's storage: pinned with the view, and the view goes when it is evicted
        self.storage: dict[Tensor, tuple[Tensor, ...]] = {}
        for layer in graph.layers:
            for j, k in layer.extra.get("alias_of", ()):
                t = graph.read(j, k)
                if t is not None:
                    base = (t,) + self.storage.get(t, ())
                    self.storage[("X", layer.id)] = self.storage.get(("X", layer.id), ()) + base
        # a view with its storage's tensors (pinned, stamped together)
        self.group = {t: (t,) + base for t, base in self.storage.items()}
        nodes = StorageNodes(graph, self.storage)
        self.node_of, self.layer_of, self.views_of = nodes.node_of, nodes.layer_of, nodes.views_of
        self.nfwd = nodes.nfwd
        self.up, self.down, self.near, self.cands = nodes.up, nodes.down, nodes.near, nodes.cands
        self.cand_node = {t: nd for nd, ts in enumerate(self.cands) for t in ts}
        self.sizes = graph.sizes   # tensor -> bytes
        self.needs = graph.needs_map   # step -> the tensors it reads
        self.nbytes = {t: graph.size(t) for ts in self.cands for t in ts}
        self.pool = Pool(len(self.nbytes))   # the resident ones, for the scan
        self.rescored = 0                    # evictions that scored beyond the bound
        # the cost at which a candidate's score reaches a given one (None: the score
        # does not grow with the cost, searches are never cut short)
        self.cost_at = COST_AT.get(score)
        # (upwards, downwards); one given limit caps both
        self.settle_limits = (SETTLE_LIMIT, SETTLE_DOWN) if settle_limit is None \
            else (settle_limit, settle_limit)
        self.settle_resets = 0               # settles cut short: bounds back to N
        self.rescore = RESCORE
        self.keep_bounds = False   # inside make_room: the pool keeps the last bounds
        self.step_info: dict[Step, tuple] = {}   # step -> allocs, bytes, ms, its op
        self.op_tables = sequences.op_tables(graph)   # ops shared per graph
        self.with_extras = frozenset(j for j in range(1, graph.n)
                                     if graph.layers[j].saved_extra_bytes
                                     and j not in graph.multi_result)
        self.views = graph.views
        # the evicted storage nodes: what the regions are made of; those back since
        # the last choice, whose bounds are still to lower (settle)
        self.evicted: set[int] = set()
        # the same per node (a list indexed by node: cheaper than sets in the inner
        # loops): NOT_EVICTED, or (evicted) the last walk of :meth:`cost` that
        # reached it, so one test says "evicted and not seen by this walk"; and a
        # visit mark per node for the settles' searches, which pass other nodes too
        self.tag = [NOT_EVICTED] * len(self.nfwd)
        self.mark = [0] * len(self.nfwd)
        self.walks = 0
        self.returned: list[int] = []
        # route index after which a freed X_j leaves the evicted neighbourhoods.  On
        # an op log (forward-only): never, as in simrd, where a released tensor stays
        # evicted, and counts, for good.  Otherwise once nothing can be recomputed
        # through it: the last use of X_j or of a consumer's output.
        if keep_released is None:
            keep_released = bool(graph.trace.source.get("forward_only"))
        if keep_released:
            self.horizon = [math.inf] * len(self.nfwd)
        else:
            last = graph.last_use
            self.horizon = [max([last.get(("X", j), -1)]
                                + [last.get(("X", c), -1) for c in graph.consumers[j]])
                            for j in self.layer_of]
        self.expiry: dict[int, list[int]] = {}   # route index -> layers leaving ``evicted``

    def pin(self, ts) -> None:
        pins, group, slot, P = self.pins, self.group, self.pool.slot, self.pool.P
        for t in ts:
            for u in group.get(t) or (t,):
                c = pins.get(u, 0)
                pins[u] = c + 1
                if not c and u in slot:
                    P[slot[u]] = math.inf

    def unpin(self, ts) -> None:
        pins, group, slot = self.pins, self.group, self.pool.slot
        for t in ts:
            for u in group.get(t) or (t,):
                c = pins[u] - 1
                pins[u] = c
                if not c and u in slot:
                    self.pool.unpinned(slot[u])

    def mark_evicted(self, j: int) -> None:
        """Node j leaves the device: it joins the regions of those that reach it
        (their cached bounds stay lower bounds: regions only grow)."""
        if j not in self.evicted:
            self.evicted.add(j)
            self.tag[j] = 0
            self.expiry.setdefault(self.horizon[j], []).append(j)
            self.near_bounds(j, 1.0)

    def near_bounds(self, j: int, sign: float) -> None:
        """Node j was evicted (+1) or came back (-1): the neighbours' bound (the
        pool's ``N``: own time plus the evicted neighbours') of each resident
        candidate next to it moves by its time (a saved extra's counts only
        the nodes its op reads)."""
        ms = sign * self.nfwd[j]
        slot, N, cands, up = self.pool.slot, self.pool.N, self.cands, self.up
        for q in self.near[j]:
            for t in cands[q]:
                i = slot.get(t)
                if i is not None and (t[0] != "S" or j in up[q]):
                    N[i] += ms

    def bound_near(self, t: Tensor) -> None:
        """Candidate ``t``'s neighbours' bound (``N``): its own time plus its
        evicted neighbours' (they are in its regions), kept up to date by
        :meth:`near_bounds` from here on."""
        nd, ev, nfwd = self.cand_node[t], self.evicted, self.nfwd
        self.pool.N[self.pool.slot[t]] = nfwd[nd] + sum(
            nfwd[k] for k in (self.up[nd] if t[0] == "S" else self.near[nd]) if k in ev)

    def unmark_evicted(self, j: int) -> None:
        """Node j is back (recomputed) or no longer needed: out of the regions now;
        the bounds of the candidates whose regions held it are lowered before the
        next choice (:meth:`settle`)."""
        if j in self.evicted:
            self.evicted.discard(j)
            self.tag[j] = NOT_EVICTED
            self.returned.append(j)
            self.near_bounds(j, -1.0)

    def settle(self) -> None:
        """Lower the cached bounds for the nodes back since the last choice, in one
        search from all of them through the evicted and the returned nodes (a
        region that held a returned node held it through nodes evicted now or
        returned since).  Those reached upwards (their downward regions held a
        returned node) lose at most the returned nodes and what the search finds
        below them, and vice versa; their bounds drop by that much (the
        neighbours' bound ``N`` stays under them).  A search in one direction
        stops past its limit (``settle_limits``) of evicted nodes: then the
        candidates it would have reached are not known, so every cached bound drops by what they
        lose (known if the other search finished), and those the other search
        reached (whose loss the stopped search would have told) fall back to
        ``N``; both stopped, every cached bound falls back to ``N``.  Deep in
        thrashing a recomputation is at the top of a long evicted chain: the
        search up from it ends at once, the one down from it would walk the
        chain."""
        back = self.returned
        if not back:
            return
        self.pool.lb = None   # bounds fall
        tag, cands, pool, nfwd = self.tag, self.cands, self.pool, self.nfwd
        mark, out = self.mark, NOT_EVICTED
        slot, K = pool.slot, pool.K
        gone = set(back)
        back.clear()
        back_ms = sum(nfwd[j] for j in gone)
        mine = [j for j in gone if cands[j]]   # returned, resident again: theirs too
        reached, mass = [], []
        for links, budget in zip((self.up, self.down), self.settle_limits):
            self.walks += 1
            walk = self.walks
            for j in gone:
                mark[j] = walk
            stack, found, ms = list(gone), list(mine), 0.0
            while stack and budget >= 0:
                for q in links[stack.pop()]:
                    if mark[q] != walk:
                        mark[q] = walk
                        if cands[q]:
                            found.append(q)
                        if tag[q] != out:   # evicted: the search goes on through it
                            stack.append(q)
                            ms += nfwd[q]
                            budget -= 1
            reached.append(found if budget >= 0 else None)
            mass.append(ms if budget >= 0 else None)
        n = len(pool)
        if reached[0] is None and reached[1] is None:
            self.settle_resets += 1
            K[:n] = 0.0
            return
        for d, found in enumerate(reached):
            if found is None:   # stopped: all drop by what the other side's lose ...
                self.settle_resets += 1
                K[:n] -= back_ms + mass[1 - d]
                for q in reached[1 - d]:   # ... and the other side's loss is unknown
                    for t in cands[q]:
                        if t in slot:
                            K[slot[t]] = 0.0
                return
        for found, loss in zip(reached, (back_ms + mass[1], back_ms + mass[0])):
            for q in found:
                for t in cands[q]:
                    if t in slot:
                        K[slot[t]] -= loss

    def cost(self, j: int, both: bool = True, limit: float = math.inf) -> float:
        """DTR's e* cost of node j: its forward time plus that of every evicted
        node it reaches through evicted nodes upwards (the evicted ancestors a
        recompute of it would need) and, with ``both``, downwards (the evicted
        descendants that would need it), as simrd's two regions; ``inf`` if they
        have more than ``chain`` layers.  The search stops once the sum exceeds
        ``limit``: the partial sum (above ``limit``) is then returned, a lower
        bound of the cost."""
        tag, nfwd = self.tag, self.nfwd
        total = nfwd[j]
        searched = False
        for links in ((self.up, self.down) if both else (self.up,)):
            self.walks += 1
            walk = self.walks
            stack = []
            for k in links[j]:
                if tag[k] < walk:   # evicted, not yet seen by this walk
                    tag[k] = walk
                    stack.append(k)
            if not stack:
                continue
            searched = True
            push, pop = stack.append, stack.pop
            while stack:
                k = pop()
                total += nfwd[k]
                if total > limit:
                    return total
                for q in links[k]:
                    if tag[q] < walk:
                        tag[q] = walk
                        push(q)
        if searched and self.chain < math.inf and 1 + self.region_size(j, both) > self.chain:
            return math.inf
        return total

    def region_size(self, j: int, both: bool) -> int:
        """How many evicted nodes :meth:`cost` reaches from node j (for ``chain``)."""
        tag, count = self.tag, 0
        for links in ((self.up, self.down) if both else (self.up,)):
            self.walks += 1
            walk = self.walks
            stack = [j]
            while stack:
                for q in links[stack.pop()]:
                    if tag[q] < walk:
                        tag[q] = walk
                        stack.append(q)
                        count += 1
        return count

    def make_room(self, need: int, step: Step) -> None:
        if self.level + need <= self.cap:
            return
        # one choice's bounds serve the next (:attr:`Pool.lb`): until the step runs
        # the clock stands still, and evictions only raise scores
        self.keep_bounds = True
        try:
            self.evict_for(need, step)
        finally:
            self.keep_bounds = False
            self.pool.lb = None

    def evict_for(self, need: int, step: Step) -> None:
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
        self.stamps[t] = res.pop(t)
        self.level -= self.sizes[t]
        self.ops.append(self.op_tables.free[t])
        j = t[1]
        if self.last_use.get(t, -1) > self.pos:   # a later route step reads it: owed
            c = self.owed.get(j, 0)
            self.owed[j] = c + 1
            if not c:
                self.owed_ms += self.fwd[j]
        if t in self.pool.slot:
            self.pool.drop(t)
        if kind(t) == "X":
            if self.views[j]:   # most layers have none: no call
                for v in self.views_going(t):
                    self.free(v)
            nd = self.node_of.get(t)
            if nd is not None and j and j not in self.views_of and self.horizon[nd] > self.pos:
                # evicted, or freed while a consumer's output may still be recomputed
                # through it: part of the evicted neighbourhoods until then
                self.mark_evicted(nd)

    def views_going(self, t: Tensor) -> list[Tensor]:
        """The resident views of ``t``'s storage, freed with it (a view goes with
        its own storage, not with another result of the same op)."""
        res, storage = self.resident, self.storage
        return [("X", v) for v in self.views[t[1]]
                if ("X", v) in res and t in storage.get(("X", v), (t,))]

    def view_stays(self, t: Tensor) -> bool:
        """A view the program releases while its storage is resident stays (it has
        no bytes; simrd's alias tensor stays defined until its storage goes)."""
        return t[1] in self.views_of and t[0] == "X" and any(
            u in self.resident for u in self.storage[t])

    def compute(self, step: Step) -> None:
        """Run a route step the way simrd's ``_materialize`` does, as an explicit
        stack of frames (recompute chains can be deep): a frame stamps all its
        step's inputs, pins the resident ones, then makes each missing one in
        order (a frame of its own for the layer that makes it, depth first) and
        pins it once it is there; then it makes room, runs, and unpins its
        inputs.  So only the inputs of the frames under way are pinned: a
        missing input's whole chain is recomputed before the next missing input
        is looked at, and what a chain made is not pinned after its consumer
        ran."""
        res = self.resident
        stack = [self._enter(step, ("X", step[1]))]
        while stack:
            frame = stack[-1]
            s, needs, missing, k, want = frame
            while k < len(missing) and missing[k] in res:
                self.pin((missing[k],))
                k += 1
            frame[3] = k
            if k < len(missing):   # the layer that makes it: a frame above this one
                stack.append(self._enter(("R", missing[k][1]), missing[k]))
                continue
            stack.pop()
            self._run(s, want)
            if self.reason is not None:
                return   # planning stops here, pins and all
            self.unpin(needs)
            if s[0] == "R" and self.remat_ms > self.remat_limit_ms:
                self.reason = (f"thrashing: recomputation {self.remat_ms:.3f} ms exceeds "
                               f"{self.remat_limit_ms:.3f} ms, (limit - 1) x the compute")
                return

    def _enter(self, step: Step, want: Tensor) -> list:
        """A frame for ``step``, made for tensor ``want``: its inputs stamped now
        (an evicted one keeps the stamp for when it is back, as simrd's storage
        does), the resident ones pinned; ``[step, needs, missing, next missing to
        make, want]``."""
        needs = self.needs[step]
        res, stamps, group, clock = self.resident, self.stamps, self.group, self.clock
        slot, A = self.pool.slot, self.pool.A
        for t in needs:
            for u in group.get(t) or (t,):   # a view's read stamps its storage
                if u in res:
                    res[u] = clock
                    if u in slot:
                        A[slot[u]] = clock
                else:
                    stamps[u] = clock
        here = [t for t in needs if t in res]
        self.pin(here)
        if step[0] == "R":
            j = step[1]
            if ("X", j) in res and j in self.with_extras:
                # saved extras evicted alone: the output goes too, the recompute
                # re-makes both (an output is re-made in place only for an op with
                # several results, docs/DESIGN.md "Op-log traces")
                self.free(("X", j))
        return [step, needs, [t for t in needs if t not in res], 0, want]

    def _run(self, step: Step, want: Tensor) -> None:
        """Make room for the step's results and run it (its inputs are resident
        and pinned).  A recompute needs room for all of its op's results, as
        simrd's does (the resident ones are made again and dropped after), and
        its resident results are not pinned meanwhile: room may be made by
        evicting them, and then they are made anew."""
        sizes = self.sizes
        info = self.step_info.get(step)
        if info is None:   # what the graph says of the step, once (ops are immutable)
            g = self.g
            allocs = g.allocs(step)
            info = self.step_info[step] = (allocs, g.param_grad_bytes(step),
                                           g.workspace_bytes(step), g.step_ms(step),
                                           self.op_tables.compute[step],
                                           sum(sizes[t] for t in allocs))
        # born: set-to-none grads, resident from here on; every result's bytes
        allocs, born, ws, ms, op, all_bytes = info
        res = self.resident
        if step[0] == "R":
            need = all_bytes
        else:
            need = sum(sizes[t] for t in allocs if t not in res)
        self.make_room(need + born + ws, step)
        if self.reason is not None:
            return
        # evictable in simrd's order: the op's other results, then the one it was
        # run for (the order breaks ties between equal scores)
        new = [t for t in allocs if t not in res and t != want]
        if want in allocs and want not in res:
            new.append(want)
        self.ops.append(op)
        self.clock += ms
        self.level += born
        if step[0] == "R":
            self.remat_ms += ms
            if step[1] in self.data_layers:
                self.remade_data = True
            if self.owed.pop(step[1], 0):
                self.owed_ms -= self.fwd[step[1]]
        pool, nbytes, fwd, pins, stamps = self.pool, self.nbytes, self.fwd, self.pins, self.stamps
        clock = self.clock
        # a route step's results are stamped when it ends; a recompute's keep the
        # stamp they had (simrd stamps an input when a frame that reads it begins,
        # and never a recompute's results)
        fresh = step[0] != "R"
        for t in new:
            last = clock if fresh else stamps.pop(t, clock)
            res[t] = last
            self.level += sizes[t]
            if t in nbytes:
                pool.add(t, last, self.nfwd[self.cand_node[t]], nbytes[t], bool(pins.get(t)))
            if t in self.node_of:
                self.unmark_evicted(self.node_of[t])
        for t in new:
            if t in nbytes:   # a first bound: own time + the evicted neighbours'
                self.bound_near(t)
        if fresh:
            slot, A = pool.slot, pool.A
            for t in allocs:
                res[t] = clock
                if t in slot:
                    A[slot[t]] = clock


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
    if d.remade_data:
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
        if d.reason is not None:
            # Infeasible: no more eviction decisions.  The rest of the route is
            # issued as it comes, missing inputs recomputed, without a budget,
            # so the schedule stays whole (the executor and validate can run it)
            # and the rest costs one linear pass.
            reason, d.reason = d.reason, None
            _run_tail(graph, d, p, frees)
            break
        for t in frees[p]:
            if t in d.resident and not d.view_stays(t):
                d.free(t)
        for j in d.expiry.pop(p, ()):
            d.unmark_evicted(j)   # nothing left to recompute through it: out of its class
    d.keep_data = False
    for t in sorted(d.kept_data):
        if t in d.resident:
            d.free(t)
    d.infeasible = reason
    return d


def _run_tail(graph: Graph, d: Planner, start: int, frees) -> None:
    """The route from step ``start`` on without a budget (after the first
    infeasible step): the ops :meth:`Planner.compute` and ``free`` issue with
    an infinite capacity (each missing input made depth first, its chain
    before the next input; a recompute of a layer with evicted saved extras
    frees its resident output first; views freed with their storage), without
    what only eviction choices read (stamps, pins, the pool, the regions and
    their bounds): nothing is evicted any more, so that bookkeeping is dead.
    ``tests/test_dtr.py`` checks the ops equal the planner's own."""
    res, needs = d.resident, d.needs
    ops, free_op, compute_op = d.ops, d.op_tables.free, d.op_tables.compute
    views, with_extras, data_layers = d.views, d.with_extras, d.data_layers
    allocs_of = graph.allocs

    def free(t: Tensor) -> None:
        if d.keep_data and t[0] == "X" and t[1] in data_layers:
            d.kept_data.add(t)
            return
        del res[t]
        ops.append(free_op[t])
        if kind(t) == "X" and views[t[1]]:
            for v in d.views_going(t):
                free(v)

    def run(step: Step) -> None:
        ops.append(compute_op[step])
        if step[0] == "R":
            d.remat_ms += graph.step_ms(step)
            if step[1] in data_layers:
                d.remade_data = True
        for t in allocs_of(step):
            res[t] = 0.0   # resident (no stamp is read any more)

    def enter(step: Step) -> list:
        if step[0] == "R" and step[1] in with_extras and ("X", step[1]) in res:
            free(("X", step[1]))
        return [step, [t for t in needs[step] if t not in res], 0]

    route = graph.route
    for p in range(start, len(route)):
        step = route[p]
        stack = [enter(step)]
        while stack:
            frame = stack[-1]
            missing, k = frame[1], frame[2]
            while k < len(missing) and missing[k] in res:
                k += 1
            frame[2] = k
            if k < len(missing):
                stack.append(enter(("R", missing[k][1])))
                continue
            stack.pop()
            run(frame[0])
        for t in frees[p]:
            if t in res and not d.view_stays(t):
                free(t)
    d.pos = len(route) - 1


@register("dtr", "dynamic eviction by cost/(size x staleness), recompute on demand", order=70)
def plan_dtr(ctx: PlanContext) -> Schedule:
    ops, stats, reason = plan_dtr_ops(ctx.graph, ctx.capacity_bytes,
                                      thrash_limit=ctx.thrash_limit)
    return finishing.finish("dtr", ctx.graph, ops, ctx.budget_bytes, stats, reason)
