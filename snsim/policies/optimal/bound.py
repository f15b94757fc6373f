"""A lower bound on the iteration time of EVERY schedule (not only the MILP's
class): one memory moment at a time (DESIGN 6a, "Moment bound").

Pick a route step u and look at the instant its compute starts (time M).
Every tensor that was made before u and that a later route step reads
(``pending``), except what step u itself reads or makes, is then either

* ``k``: allocated on the device while step u runs (counted in its level,
  which is at most the capacity: static bytes, the parameter gradients born
  so far and step u's least need are there too);
* ``w``: not allocated, so its device copy was released before M: its
  offload ended before M (the device-to-host engine copies it after the
  tensor was first made), and it comes back by a prefetch issued after step
  u, which ends before the first later step that reads it starts (a tensor
  only a recomputation reads: before the latest such step of the tensors
  remade from it, :meth:`Moments.deadlines`);
* ``r``: remade after M by recomputing its layer (the compute stream pays
  the layer's fastest forward time once), which needs the layer's inputs:
  each of them is allocated at M, brought back, or remade itself.

Each schedule gives such a choice (by the tensor's first appearance after
M), so the least makespan over the choices, with the compute stream, the two
copy engines and the step times at their fastest algorithms, is a lower
bound of every schedule's.  It is solved as a small MILP (a few binaries per
tensor); the solver's dual bound is what is used, so a time limit keeps it
valid.  The best moment is the bound; moments are screened by their LP
relaxation (also a valid bound) and the few best solved as MILPs.

What it leaves out (so it stays a bound): memory of tensors that share
storage (in-place outputs, views), parameter buffers, held results, gradients
recomputed (never possible), prefetches issued before M (they are allocated
at M: ``k``), and every moment but one.
"""

from __future__ import annotations

import math
import time

from snsim.graph import Graph
from snsim.policies.optimal.milp import MiB, Milp, add, running_sums
from snsim.policies.optimal.solve import solve


class Moments:
    """What every moment's model shares: min step times, producers, readers."""

    def __init__(self, g: Graph):
        self.g = g
        route = g.route
        self.K = K = len(route)
        ws = lambda s: max(1, len(g.layers[s[1]].workspace))  # noqa: E731
        self.c = [min(g.step_ms(s, a) for a in range(ws(s))) for s in route]
        self.prefix = [0.0]
        for x in self.c:
            self.prefix.append(self.prefix[-1] + x)      # prefix[k]: steps 0..k-1
        self.opt_ms = g.optimizer_ms
        self.rc = {}   # layer -> its fastest recomputation
        for j, layer in enumerate(g.layers):
            if layer.kind != "data":
                self.rc[j] = min(g.step_ms(("R", j), a)
                                 for a in range(max(1, len(layer.workspace))))
        # earliest a forward tensor can exist: every ancestor layer (and its own)
        # computed once, serially on the compute stream
        anc: list[set] = []
        self.ready: dict = {}
        for j, layer in enumerate(g.layers):
            s = {j}
            for i in layer.inputs:
                s |= anc[i]
            anc.append(s)
        self.prod: dict = {}     # tensor -> first route step that makes it
        self.reads: dict = {}    # tensor -> sorted route steps that read it
        for k, s in enumerate(route):
            for t in g.allocs_map[s]:
                self.prod.setdefault(t, k)
            for t in g.needs_map[s]:
                self.reads.setdefault(t, []).append(k)
        for t, k in self.prod.items():
            s = route[k]
            if s[0] == "F":
                self.ready[t] = sum(self.c[i] for i in anc[s[1]])
            else:
                self.ready[t] = self.prefix[k + 1]
        self.remade: dict = {}   # tensor -> layer whose recomputation remakes it
        for j in self.rc:
            for t in g.allocs_map[("R", j)]:
                self.remade[t] = j
        # tensors whose memory the bound does not count (shared storage)
        skip = set()
        for i, t in g.in_place_of.items():
            skip.add(t)
            skip.add(("X", i))
        for j, vs in enumerate(g.views):
            if vs:
                skip.add(("X", j))
                skip.update(("X", v) for v in vs)
        skip.update(t for t in g.sizes if t[0] == "P")
        self.skip = skip
        self.born = [0]
        for s in route:
            self.born.append(self.born[-1] + g.param_grad_bytes(s))

    def each_step_fits(self, cap: int) -> bool:
        """Whether every route step alone (with the static bytes and the
        parameter gradients born by then) fits ``cap``."""
        g = self.g
        return all(g.trace.static_bytes + self.born[u + 1] + g.least_step_bytes(s) <= cap
                   for u, s in enumerate(g.route))

    def screen(self, cap: int) -> list[int]:
        """The moments, most promising first: by the bytes pending at each step
        beyond what fits, over the time around it for copying them."""
        g, K = self.g, self.K
        diff = [0] * (K + 2)
        for t, k in self.prod.items():
            r = self.reads.get(t)
            if r and r[-1] > k + 1 and t not in self.skip:
                diff[k + 1] += g.size(t)
                diff[r[-1]] -= g.size(t)
        rate = 1e3 / min(g.trace.device.d2h_Bps, g.trace.device.h2d_Bps)
        score, level = [], 0
        for u, step in enumerate(g.route):
            level += diff[u]
            room = (cap - g.trace.static_bytes - self.born[u + 1] - g.least_step_bytes(step))
            window = min(self.prefix[u + 1], self.prefix[K] - self.prefix[u]) + 1e-9
            score.append(((level - room) * rate / window, u))
        return [u for _, u in sorted(score, reverse=True)]

    def model(self, u: int, cap: int) -> tuple[Milp, int] | None:
        """The moment model at route step u (None: step u alone does not fit)."""
        g, route, K = self.g, self.g.route, self.K
        step = route[u]
        here = set(g.needs_map[step]) | set(g.allocs_map[step])
        room = (cap - g.trace.static_bytes - self.born[u + 1] - g.least_step_bytes(step))
        if room < 0:
            return None
        # pending: made before u, read after u
        pend = [t for t, k in self.prod.items() if k < u and t not in here
                and self.reads.get(t) and self.reads[t][-1] > u]
        # closure: inputs of pending recomputable tensors, transitively
        tensors = set(pend)
        todo = [t for t in pend if t in self.remade]
        seen_layers = set()
        while todo:
            t = todo.pop()
            j = self.remade[t]
            if j in seen_layers:
                continue
            seen_layers.add(j)
            for x in g.needs_map[("R", j)]:
                if x not in here and x not in tensors and self.prod.get(x, K) < u:
                    tensors.add(x)
                    if x in self.remade:
                        todo.append(x)
        m = Milp()
        kv, wv, rv = {}, {}, {}
        for t in sorted(tensors):
            kv[t] = m.var()
            wv[t] = m.var()
        for j in sorted(seen_layers):
            rv[j] = m.var()
        M = m.var(self.prefix[u], math.inf, integer=False)
        Z = m.var(0.0, math.inf, cost=1.0, integer=False)

        def avail(t) -> dict:
            terms = {kv[t]: 1.0, wv[t]: 1.0}
            add(terms, rv.get(self.remade.get(t)), 1.0)
            return terms

        for t in pend:
            m.row(avail(t), lo=1.0)
        for j, r in rv.items():
            for x in g.needs_map[("R", j)]:
                if x in kv:
                    terms = avail(x)
                    add(terms, r, -1.0)
                    m.row(terms, lo=0.0)
        # memory while step u runs
        mem = {kv[t]: g.size(t) / MiB for t in kv if t not in self.skip and g.size(t)}
        m.row(mem, hi=room / MiB)
        d2h = 1e3 / g.trace.device.d2h_Bps
        h2d = 1e3 / g.trace.device.h2d_Bps
        # d2h: what is on the host by M was copied after it was made (one row per
        # release time, through running sums of the bytes made at or after it)
        by_ready: dict = {}
        for t in kv:
            by_ready.setdefault(self.ready[t], []).append(t)
        for q, a in running_sums(m, copy_parts(g, by_ready, sorted(by_ready, reverse=True),
                                               wv, d2h)):
            m.row({M: 1.0, a: -1.0}, lo=q)
        # compute after M: step u on, and every recomputation
        terms = {Z: 1.0, M: -1.0}
        for j, r in rv.items():
            add(terms, r, -self.rc[j])
        m.row(terms, lo=self.prefix[K] - self.prefix[u] + self.opt_ms)
        # h2d: prefetches issued after step u, each ended before its next reader
        # starts (running sums over the readers in route order)
        by_first: dict = {}
        for t, v in self.deadlines(u, pend, tensors, seen_layers).items():
            by_first.setdefault(v, []).append(t)
        for v, a in running_sums(m, copy_parts(g, by_first, sorted(by_first), wv, h2d)):
            m.row({Z: 1.0, M: -1.0, a: -1.0},
                  lo=self.c[u] + self.prefix[K] - self.prefix[v] + self.opt_ms)
        terms = {Z: 1.0, M: -1.0}
        for t in kv:
            add(terms, wv[t], -g.size(t) * h2d)
        m.row(terms, lo=self.c[u] + self.opt_ms)
        return m, Z


    def deadlines(self, u: int, pend: list, tensors: set, layers: set) -> dict:
        """The route step before whose start a tensor of the moment model that is
        on the host (``w``) at step u is back: for a pending tensor, its first
        reader after u; for one only a recomputation needs (the closure), the
        latest deadline of the tensors remade from it.  (If it is brought back
        at all, it is because a tensor remade after u reads it; that remake
        runs before its own tensor's deadline, after the copy ended.  A
        schedule that brings it back for nothing maps to the model with it
        neither kept, on the host nor remade, since no row then needs it.)"""
        g = self.g
        due = {t: next(k for k in self.reads[t] if k > u) for t in pend}
        changed = True
        while changed:   # the closure is a DAG of remakes: a few passes
            changed = False
            for j in layers:
                made = [due[t] for t in g.allocs_map[("R", j)] if t in due]
                if not made:
                    continue
                for x in g.needs_map[("R", j)]:
                    if x in tensors and x not in pend and due.get(x, -1) < max(made):
                        due[x] = max(made)
                        changed = True
        return due


def lp_value(m: Milp, seconds: float) -> float:
    """The LP relaxation's optimum (a valid bound); -inf if not solved."""
    sol = solve(m.relaxed(), seconds)
    return sol.objective if sol.status == "optimal" else -math.inf


def moment_bound(g: Graph, cap: int, seconds: float = 10.0, exact: int = 8,
                 stats: dict | None = None) -> float:
    """The best moment's bound (ms) within about ``seconds``: every moment's LP
    relaxation, then the ``exact`` best as MILPs (their dual bounds).  The
    compute bound when no moment says more; inf when some step alone does not
    fit ``cap``."""
    t0 = time.perf_counter()
    mo = Moments(g)
    base = mo.prefix[mo.K] + mo.opt_ms
    if not mo.each_step_fits(cap):
        return math.inf
    scored = []
    for u in mo.screen(cap):
        left = seconds * 0.5 - (time.perf_counter() - t0)
        if left <= 0:
            break
        m, _ = mo.model(u, cap)
        if len(m.lb) <= 2:
            continue
        scored.append((lp_value(m, max(0.05, left)), u, m))
    scored.sort(key=lambda x: -x[0])
    best = max([base] + [v for v, _, _ in scored])
    where = scored[0][1] if scored and scored[0][0] >= best else None
    for v, u, m in scored[:exact]:
        left = seconds - (time.perf_counter() - t0)
        if left <= 0.05 or v <= base:
            break
        sol = solve(m, min(left, max(0.2, seconds / (2 * exact))))
        b = sol.objective if sol.status == "optimal" else max(sol.bound, v)
        if b > best:
            best, where = b, u
    if stats is not None:
        stats["moment_bound_ms"] = round(best, 6)
        stats["moment_step"] = None if where is None else g.step_label(g.route[where])
        stats["moment_s"] = round(time.perf_counter() - t0, 3)
    return best


def copy_parts(g: Graph, groups: dict, keys, wv: dict, ms_per_byte: float):
    """Per key of ``keys`` in order, (key, the copy time terms of its group): each
    tensor's ``ms_per_byte`` x bytes by its binary in ``wv``."""
    for q in keys:
        yield q, {wv[t]: g.size(t) * ms_per_byte for t in groups[q]}
