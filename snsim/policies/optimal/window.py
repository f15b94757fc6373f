"""A lower bound on the iteration time of EVERY schedule over a window of
consecutive route steps (DESIGN 6a, "Window bound"): the moment bound of
:mod:`.bound` at every step of the window at once, linked step to step.

For route steps ``a..b`` and every tensor the window may need (made before
the step, read by a later route step, or an input of a layer whose
recomputation remakes one of those, transitively), the model has

* ``D[k,t]``: t is allocated while step k runs (what step k reads or makes
  always is; the level is at most the capacity: static bytes, the
  parameter gradients born so far and step k's least need are there too);
* ``arr[g,t]``: t arrives in the gap before step g (between the computes of
  steps g-1 and g): copied back (``h[g,t]``, the host-to-device engine) or
  remade (``rm[g,j]``: layer j recomputed there, at its fastest time on the
  compute stream; its inputs there, each kept through step g-1 or arriving
  in the same gap; the level at that instant holds what stays allocated
  through the gap and the recomputation's least need);
* ``D[g,t] <= D[g-1,t] + arr[g,t]``: what is there at step g was there at
  step g-1 or arrived in between;
* the compute stream (``T[k]`` the start of step k: after step k-1 and the
  recomputations of gap k) and the host-to-device engine: the copies
  issued in gaps p+1..q (each after step p ends) that must end by step q's
  start fit in ``T[q] - T[p] - c[p]``.  A copy not kept to step g fed a
  recomputation in gap g, so it ends before step g; one kept ends before
  t's first reader from g on, or (a tensor no later step reads) before the
  last step that what its recomputations make serves;
* the device-to-host engine, for a tensor made inside the window that is
  copied back: its offload starts after its maker ends and ends before the
  copy back does, and before any step at which it is away and copied back
  later with no remake of it in between (the simulator's free waits for the
  offload: until then its memory counts; a remade tensor may be offloaded
  again after its remake).

Each schedule maps to a solution (a tensor counted where its memory counts
and it is still to be read; copies and recomputations that nothing reads
are left out), so the least ``Z`` is a lower bound of every schedule's time.
What it leaves out (so it stays a bound): every step before the window is
at its fastest time, and so are the steps after it; tensors made before the
window are on the host for free (their offloads are not priced); tensors
that share storage (in-place outputs, views, parameter buffers) count no
memory and are always there; a kept copy that only recomputations read
ends by the last step they serve, not by the recomputation; the level
inside a gap counts only what stays through it and the recomputation's
least need.

Checked: never above a brute-forced optimum of the tiny traces (and equal
to it on chain5), nor above any policy's simulated plan on random DAGs
(the test's 30 seeds, and a one-off sweep of seeds 30-200: 2788 plans) and the
shipped traces (tests/test_optimal_window.py).
"""

from __future__ import annotations

import math
import time

from snsim.graph import Graph
from snsim.policies.optimal.bound import Moments
from snsim.policies.optimal.milp import MiB, Milp, add, running_sums
from snsim.policies.optimal import child
from snsim.policies.optimal.solve import Solution, solve


class WindowModel:
    """The window model of route steps ``a..b`` (inclusive); ``milp`` None when
    some step of it alone does not fit ``cap``."""

    def __init__(self, mo: Moments, cap: int, a: int, b: int):
        g = mo.g
        self.mo, self.a, self.b = mo, a, b
        route = g.route
        static = g.trace.static_bytes
        here = [set(g.needs_map[route[k]]) | set(g.allocs_map[route[k]]) for k in range(a, b + 1)]
        self.here = lambda k: here[k - a]   # noqa: E731
        skip = mo.skip
        # tensors read by a route step in the window or after it, made before b
        base = set()
        for t, k in mo.prod.items():
            r = mo.reads.get(t)
            if k < b and r and r[-1] > a and t not in skip:
                base.add(t)
        tensors, layers = set(base), set()
        todo = [t for t in base if t in mo.remade]
        while todo:
            j = mo.remade[todo.pop()]
            if j in layers:
                continue
            layers.add(j)
            for x in g.needs_map[("R", j)]:
                if x not in skip and x not in tensors and mo.prod.get(x, mo.K) < b:
                    tensors.add(x)
                    if x in mo.remade:
                        todo.append(x)
        self.tensors, self.layers = tensors, layers
        m = Milp()
        self.milp = m
        D: dict = {}     # (k, t) -> column; (k, t) with t in here(k): present, no column

        due = remake_due_of(mo, tensors, layers)

        def tracked(k: int, t) -> bool:
            """t may be allocated at step k and a later step, or a recomputation
            that serves one, may still need it."""
            if mo.prod.get(t, mo.K) >= k or t in self.here(k):
                return False
            r = mo.reads.get(t)
            return (r is not None and r[-1] > k) or due.get(t, -1) > k

        rooms = []
        for k in range(a, b + 1):
            room = cap - static - mo.born[k + 1] - g.least_step_bytes(route[k])
            if room < 0:
                self.milp = None
                return
            rooms.append(room)
            for t in sorted(tensors):
                if tracked(k, t):
                    D[k, t] = m.var()

        def present(k: int, t) -> dict:
            """Terms of 'allocated at step k' (empty: not there; None: surely there)."""
            if t in self.here(k):
                return None
            v = D.get((k, t))
            return {} if v is None else {v: 1.0}

        self.present = present

        # memory at each step
        for k, room in zip(range(a, b + 1), rooms):
            terms = {D[k, t]: g.size(t) / MiB for t in tensors if (k, t) in D and g.size(t)}
            if terms:
                m.row(terms, hi=room / MiB)
        rc = mo.rc
        T = {k: m.var(mo.prefix[a] if k == a else 0.0, math.inf, integer=False)
             for k in range(a, b + 1)}
        Z = m.var(0.0, math.inf, cost=1.0, integer=False)
        self.Z = Z
        h: dict = {}
        rm: dict = {}
        arr: dict = {}
        kept: dict = {}      # gap -> {column: MiB} of what stays allocated through it
        kept_of: dict = {}   # gap -> {tensor: its column there}
        readers: dict = {}   # tensor -> the layers of the model whose recomputation reads it
        for j in layers:
            for x in g.needs_map[("R", j)]:
                readers.setdefault(x, []).append(j)
        self.level_rows: dict = {}   # (gap, layer) -> index of its recomputation's level row
        made_in = {t for t in tensors if mo.prod[t] >= a}
        for gap in range(a + 1, b + 1):
            for j in sorted(layers):
                # its inputs exist by then
                if all(x in skip or mo.prod.get(x, mo.K) < gap for x in g.needs_map[("R", j)]):
                    rm[gap, j] = m.var()
            for t in sorted(tensors):
                if mo.prod[t] >= gap:
                    continue
                now, before = present(gap, t), present(gap - 1, t)
                if now == {} and not any((gap, j) in rm for j in readers.get(t, ())):
                    continue   # neither there at step gap nor read by a remake in the gap
                arr[gap, t] = av = m.var(integer=False)
                h[gap, t] = hv = m.var()
                terms = {av: 1.0, hv: -1.0}
                add(terms, rm.get((gap, mo.remade.get(t))), -1.0)
                m.row(terms, hi=0.0)                       # arr <= h + rm
                if before is not None and now != {}:
                    # there at step gap (surely, or by its column): there before, or arrived
                    terms = {av: 1.0}
                    for v, c in before.items():
                        add(terms, v, c)
                    if now is None:
                        m.row(terms, lo=1.0)
                    else:
                        for v, c in now.items():
                            add(terms, v, -c)
                        m.row(terms, lo=0.0)
                # what stays through the gap: kc >= before + now - 1 - arr
                if now == {} or before == {}:
                    continue
                if g.size(t):
                    kc = m.var(0.0, 1.0, integer=False)
                    terms = {kc: 1.0, av: 1.0}
                    lo = -1.0
                    for part in (before, now):
                        if part is None:
                            lo += 1.0
                        else:
                            for v, c in part.items():
                                add(terms, v, -c)
                    m.row(terms, lo=lo)
                    kept.setdefault(gap, {})[kc] = g.size(t) / MiB
                    kept_of.setdefault(gap, {})[t] = kc
            # a remake's inputs are there: kept through step gap-1 or arrived in the gap
            for j in sorted(layers):
                r = rm.get((gap, j))
                if r is None:
                    continue
                for x in g.needs_map[("R", j)]:
                    if x in skip:
                        continue
                    before = present(gap - 1, x)
                    if before is None:
                        continue
                    terms = {r: -1.0}
                    add(terms, arr.get((gap, x)), 1.0)
                    for v, c in before.items():
                        add(terms, v, c)
                    m.row(terms, lo=0.0)
                # the level while it runs
                io = set(g.needs_map[("R", j)]) | set(g.allocs_map[("R", j)])
                of = kept_of.get(gap, {})
                terms = dict(kept.get(gap, {}))
                for t in io:
                    if t in of:
                        terms.pop(of[t], None)
                terms[r] = g.least_step_bytes(("R", j)) / MiB
                self.level_rows[gap, j] = len(m.rows)
                m.row(terms, hi=(cap - static - mo.born[gap]) / MiB)
        self.D, self.T, self.h, self.rm, self.arr = D, T, h, rm, arr
        # compute stream
        for k in range(a + 1, b + 1):
            terms = {T[k]: 1.0, T[k - 1]: -1.0}
            for j in layers:
                add(terms, rm.get((k, j)), -rc[j])
            m.row(terms, lo=mo.c[k - 1])
        m.row({Z: 1.0, T[b]: -1.0}, lo=mo.prefix[mo.K] - mo.prefix[b] + mo.opt_ms)
        # host-to-device: per q, running sums back from q over the gaps
        h2d = 1e3 / g.trace.device.h2d_Bps
        d2h = 1e3 / g.trace.device.d2h_Bps
        # each copy back as pieces by the step whose start it ends before: one
        # not there at step gap fed a recomputation in the gap (before step gap);
        # one kept to step gap ends before t's first reader from gap on, or (a
        # tensor no later step reads) before the last that a recomputation fed by
        # it serves; (gap, t, terms, deadline), a deadline past b: no row
        pieces = []
        for (gap, t), hv in h.items():
            f = next((k for k in mo.reads.get(t, ()) if k >= gap), None)
            later = f if f is not None else due.get(t)
            now = present(gap, t)
            if now is None:
                pieces.append((gap, t, {hv: 1.0}, later))
            elif now == {}:
                pieces.append((gap, t, {hv: 1.0}, gap))
            else:
                hk = m.var(integer=False)
                m.row({hk: 1.0, next(iter(now)): -1.0}, hi=0.0)   # kept: there at step gap
                m.row({hk: 1.0, hv: -1.0}, hi=0.0)
                pieces.append((gap, t, {hv: 1.0, hk: -1.0}, gap))
                pieces.append((gap, t, {hk: 1.0}, later))
        by_gap: dict = {}
        for gap, t, terms, v in pieces:
            if v is not None and v <= b:
                by_gap.setdefault(gap, []).append((t, terms, max(v, gap)))
        for q in range(a + 1, b + 1):
            parts = []
            for gap in range(q, a, -1):
                terms: dict = {}
                for t, part, v in by_gap.get(gap, ()):
                    if v <= q:
                        for col, c in part.items():
                            add(terms, col, c * g.size(t) * h2d)
                parts.append((gap, terms))
            for gap, acc in running_sums(m, parts):
                # copies issued after step gap-1 ends, done by step q's start
                m.row({T[q]: 1.0, T[gap - 1]: -1.0, acc: -1.0}, lo=mo.c[gap - 1])
        # device-to-host, for the tensors made in the window that are copied back:
        # off[v,t] = its offload ended by step v's start (it starts after its
        # maker ends), at least where a copy back is read by step v, and where
        # t is away at step v and copied back later with no remake of it in
        # between (a free waits for its offload)
        off: dict = {}
        pieces_of: dict = {}
        for piece in pieces:
            if piece[1] in made_in:
                pieces_of.setdefault(piece[1], []).append(piece)
        for t in sorted(pieces_of):
            prev = z = None
            col = {v: m.var(integer=False) for v in range(mo.prod[t] + 1, b + 1)}
            for v in range(mo.prod[t] + 1, b + 1):
                off[v, t] = col[v]
                if prev is not None:
                    m.row({col[v]: 1.0, prev: -1.0}, lo=0.0)
                prev = col[v]
            for gap, u, part, v in pieces_of[t]:
                if v is not None and v <= b:
                    terms = {col[max(v, gap)]: 1.0}
                    for c, x in part.items():
                        add(terms, c, -x)
                    m.row(terms, lo=0.0)
            j = mo.remade.get(t)
            for k in range(b - 1, mo.prod[t], -1):   # z: copied back after step k
                hv = h.get((k + 1, t))
                if z is None and hv is None:
                    continue
                nz = m.var(integer=False)
                if z is not None:
                    # not across a remake of t: a remade tensor may be offloaded
                    # after its remake, and copied back from that copy
                    terms = {nz: 1.0, z: -1.0}
                    add(terms, rm.get((k + 1, j)), 1.0)
                    m.row(terms, lo=0.0)
                if hv is not None:
                    m.row({nz: 1.0, hv: -1.0}, lo=0.0)
                z = nz
                d = D.get((k, t))
                if d is not None:
                    m.row({col[k]: 1.0, z: -1.0, d: 1.0}, lo=0.0)
        made_at: dict = {}   # step -> the tensors of ``off`` it makes
        for t in sorted(pieces_of):
            made_at.setdefault(mo.prod[t], []).append(t)
        for v in range(a + 1, b + 1):
            parts = ((p, {off[v, t]: g.size(t) * d2h for t in made_at.get(p, ()) if (v, t) in off})
                     for p in range(v - 1, a - 1, -1))
            for p, acc in running_sums(m, parts):
                m.row({T[v]: 1.0, T[p]: -1.0, acc: -1.0}, lo=mo.c[p])

TAILS = (20, 40)   # the windows tried: the route's last 20, then last 40 steps
ISOLATE_NONZEROS = 20_000   # a window model this large is solved in a killable child


def search(m: Milp, seconds: float, **kw) -> Solution:
    """:func:`solve` for a window model: one of ``ISOLATE_NONZEROS`` nonzeros or
    more in a child killed at the limit (HiGHS overran its own by 7-9 s on
    ResNet-50's 40 steps, the machine loaded)."""
    big = child.available() and m.nonzeros >= ISOLATE_NONZEROS
    return solve(m, seconds, isolate=big, **kw)


def remake_due_of(mo: Moments, tensors: set, layers: set) -> dict:
    """Per tensor of the model, the last route step a recomputation it feeds can
    serve: the last read of what the recomputation makes, or in turn of what
    that feeds (None: nothing of the model reads it)."""
    g = mo.g
    due: dict = {}
    changed = True
    while changed:   # the remakes form a DAG: a few passes
        changed = False
        for j in layers:
            outs = [u for u in g.allocs_map[("R", j)] if u in tensors]
            last = [mo.reads[u][-1] for u in outs if u in mo.reads]
            last += [due[u] for u in outs if u in due]
            if not last:
                continue
            top = max(last)
            for x in g.needs_map[("R", j)]:
                if x in tensors and due.get(x, -1) < top:
                    due[x] = top
                    changed = True
    return due


def window_bound(g: Graph, cap: int, seconds: float = 10.0, stats: dict | None = None,
                 tails: tuple[int, ...] = TAILS) -> float:
    """The best window bound (ms) within about ``seconds``: each window of the
    route's last ``tails`` steps solved as a MILP in turn (its dual bound), the
    shorter first (its dual bound nears its optimum within seconds: ResNet-50
    b32 at 1.05x, 1.053 of 1.058 x compute in 5 s, solved in 17 s; the
    longer one is rarely solved).  The compute bound when no window says more; inf
    when some step alone does not fit ``cap``.  Only tails: on ResNet-50 b32
    at 1.05x the lower bound, windows in the middle of the route (F175-B111,
    B151-B91) said nothing above the compute bound, where the last 20 / 40
    steps (stage 1's backward, whose 106 MB tensors take longer to copy than
    to compute) said 1.056 / 1.094 x compute in 10 s."""
    t0 = time.perf_counter()
    mo = Moments(g)
    base = mo.prefix[mo.K] + mo.opt_ms
    if not mo.each_step_fits(cap):
        return math.inf
    best, where, lengths = base, None, sorted({min(n, mo.K) for n in tails})
    for i, n in enumerate(lengths):
        left = seconds - (time.perf_counter() - t0)
        if left <= 0.05:
            break
        w = WindowModel(mo, cap, mo.K - n, mo.K - 1)
        share = left / (len(lengths) - i) if i < len(lengths) - 1 else left
        sol = search(w.milp, max(0.05, share))
        if sol.status == "optimal":
            b = sol.objective
        elif sol.status == "infeasible":
            b = -math.inf   # (a relaxation; a plan that fits proves otherwise)
        else:
            b = sol.bound
        if b > best:
            best, where = b, n
    if stats is not None:
        stats["window_bound_ms"] = round(best, 6)
        stats["window_steps"] = where
        stats["window_s"] = round(time.perf_counter() - t0, 3)
    return best
