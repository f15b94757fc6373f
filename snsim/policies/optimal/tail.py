"""A primal heuristic from the window model (:mod:`.window`): the best plan's
last route steps planned again by the window's MILP, its solution decoded
into ops and spliced after the plan's own prefix (DESIGN 6a, "Tail splice").

The window model is a relaxation of every schedule over the route's last
steps.  Restricted to what the plan's prefix leaves (what is allocated at
the window's first step is fixed to what the prefix holds there; a tensor
made before the window is copied in only if the prefix offloaded it; a
recomputation never remakes a tensor still allocated), its solutions read
as schedules of the tail: per gap between two computes, frees, the
recomputations (their inputs copied in and waited for first), copies in for
later steps, then the step (waiting for what it reads).  A tensor made in
the window and copied back later is offloaded right after its maker.  The
relaxation's leftovers (the level inside a gap, copies ending by a later
reader than a recomputation) may make a decoded tail slower or not fit: the
spliced plan is kept only if it passes the ledger's rules, fits the
capacity and is faster by the simulator's rules (:func:`replay.estimate_ms`).
"""

from __future__ import annotations

import time

from snsim.errors import ScheduleError
from snsim.graph import Graph
from snsim.policies import replay
from snsim.policies.optimal.bound import Moments
from snsim.policies.optimal.milp import MiB
from snsim.policies.optimal.window import WindowModel, search
from snsim.schedule import ledger
from snsim.schedule.ops import Compute, Free, Offload, Op, Prefetch, Wait


class Unusable(Exception):
    """The window's solution does not read as a schedule of the tail."""


def holding(graph: Graph, ops: list[Op]) -> tuple[set, set, set]:
    """(allocated, in flight, with a host copy) after ``ops``."""
    held, flight, host = set(), set(), set()
    for o in ops:
        kind = type(o)
        if kind is Compute:
            held.update(graph.allocs_map[o.step])
            continue
        t = o.tensor
        if kind is Free:
            held.discard(t)
            flight.discard(t)
        elif kind is Offload:
            host.add(t)
        elif kind is Prefetch:
            held.add(t)
            flight.add(t)
        elif kind is Wait:
            flight.discard(t)
    return held, flight, host


def splice(g: Graph, cap: int, ops: list[Op], ms: float, steps: int, seconds: float
           ) -> tuple[float, list[Op]] | None:
    """(ms, ops): ``ops`` with its last ``steps`` route steps planned by the
    window model, if that passes the ledger, fits ``cap`` and is faster than
    ``ms``; None otherwise (or when the tail holds shared storage)."""
    t0 = time.perf_counter()
    mo = Moments(g)
    a = mo.K - steps
    if a <= 0:
        return None
    route_at = [i for i, o in enumerate(ops) if type(o) is Compute and o.phase in "FB"]
    if len(route_at) != mo.K:
        return None
    prefix = ops[:route_at[a] + 1]
    algo = {ops[i].step: ops[i].algo for i in route_at}
    held, flight, host = holding(g, prefix)
    w = WindowModel(mo, cap, a, mo.K - 1)
    if w.milp is None or (w.tensors | held) & mo.skip:
        return None
    restrict(g, w, held, host)
    m = w.milp
    start = own_start(g, w, ops[route_at[a] + 1:], held)
    left = seconds - (time.perf_counter() - t0)
    if left < 0.1:
        return None   # the model took the time: no search
    sol = search(m, left, start=start)
    if sol.values is None:
        return None
    try:
        tail = decode(g, w, sol.values, {t for t in held if t in g.sizes}, flight, host, algo)
    except Unusable:
        return None
    new = prefix + tail
    try:
        ledger.walk(g, replay.with_optimizer_step(g, new))
    except ScheduleError:
        return None
    if replay.planned_peak(g, new, cap)[1] is not None:
        return None
    t = replay.estimate_ms(g, new, cap, ms)
    return (t, new) if t < ms - 1e-9 else None


def restrict(g: Graph, w: WindowModel, held: set, host: set) -> None:
    """Restrict the window model ``w`` (from step ``w.a``) to what a plan whose
    prefix leaves ``held`` allocated and ``host`` on the host can continue
    with (see the module), in place."""
    mo, a = w.mo, w.a
    m = w.milp
    for (k, t), v in w.D.items():
        if k == a:
            m.lb[v] = m.ub[v] = 1.0 if t in held else 0.0
    for (gap, t), v in w.h.items():
        if mo.prod[t] < a and t not in host:
            m.ub[v] = 0.0
    for (gap, j), v in w.rm.items():
        for u in g.allocs_map[("R", j)]:
            before = w.present(gap - 1, u)
            if before is None:
                m.ub[v] = 0.0
            elif before:
                terms = {v: 1.0}
                terms.update(before)
                m.row(terms, hi=1.0)   # never remakes what is still allocated
    # what the decoded gap holds when a recomputation runs: the outputs of the
    # gap's earlier recomputations too (the bound need not count them)
    in_gap: dict = {}
    for (gap, i), v in w.rm.items():
        in_gap.setdefault(gap, []).append((i, v))
    for (gap, j), idx in w.level_rows.items():
        cols, vals, lo, hi = m.rows[idx]
        io = set(g.needs_map[("R", j)]) | set(g.allocs_map[("R", j)])
        cols, vals = list(cols), list(vals)
        copied = set()
        for i, v in sorted(in_gap[gap]):
            if i >= j:
                break
            extra = sum(g.size(u) for u in g.allocs_map[("R", i)] if u not in io)
            if extra:
                cols.append(v)
                vals.append(extra / MiB)
            copied.update(t for t in g.needs_map[("R", i)] if t not in io)
        for t in sorted(copied):   # copied in for an earlier one, held until the step
            v = w.h.get((gap, t))
            if v is not None and g.size(t):
                cols.append(v)
                vals.append(g.size(t) / MiB)
        m.rows[idx] = (cols, vals, lo, hi)


def own_start(g: Graph, w: WindowModel, tail: list[Op], held: set
              ) -> tuple[list[int], list[float]]:
    """The plan's own tail read as the model's binaries (what is allocated at
    each step, the copies in and the recomputations of each gap): the
    solver's first incumbent where it satisfies every row (the restrictions
    above may refuse it; the search then starts from nothing)."""
    held = set(held)
    gap, ones = w.a + 1, {w.D.get((w.a, t)) for t in held}
    for o in tail:
        kind = type(o)
        if kind is Compute:
            if o.phase == "R":
                ones.add(w.rm.get((gap, o.layer)))
                held.update(g.allocs_map[o.step])
                continue
            ones.update(w.D.get((gap, t)) for t in held)
            held.update(g.allocs_map[o.step])
            gap += 1
            if gap > w.b:
                break
        elif kind is Prefetch:
            ones.add(w.h.get((gap, o.tensor)))
            held.add(o.tensor)
        elif kind is Free:
            held.discard(o.tensor)
    ones.discard(None)
    cols = sorted(ones)
    return cols, [1.0] * len(cols)


def decode(g: Graph, w: WindowModel, x: list[float], held: set, flight: set, host: set,
           algo: dict) -> list[Op]:
    """The tail's ops from the window model's solution ``x`` (see the module)."""
    mo, a, b = w.mo, w.a, w.b
    on = lambda v: v is not None and x[v] > 0.5   # noqa: E731
    held, flight, host = set(held), set(flight), set(host)
    copied_later: dict = {}   # tensor made in the window -> copied back at some gap
    for (gap, t), v in w.h.items():
        if on(v) and mo.prod[t] >= a:
            copied_later[t] = True
    out: list[Op] = []

    def ready(t, gap: int) -> None:
        if t not in held:
            if not on(w.h.get((gap, t))) or t not in host:
                raise Unusable(f"gap {gap}: {t} is neither there nor copied in")
            out.append(Prefetch(t))
            held.add(t)
            flight.add(t)
        if t in flight:
            out.append(Wait(t))
            flight.discard(t)

    def release(keep: set) -> None:
        for t in sorted(held - keep):
            if t in flight:
                out.append(Wait(t))
                flight.discard(t)
            out.append(Free(t))
            held.discard(t)

    for gap in range(a + 1, b + 1):
        step = g.route[gap]
        there = {t for t in held | w.tensors if w.present(gap, t) is None
                 or on(next(iter(w.present(gap, t)), None))}
        there |= set(g.needs_map[step])
        for t in sorted(held):
            if t in copied_later and t not in host:
                out.append(Offload(t))
                host.add(t)
        remakes = sorted(j for (k, j), v in w.rm.items() if k == gap and on(v))
        inputs = {x_ for j in remakes for x_ in g.needs_map[("R", j)]}
        # one the model copies in again in this gap goes first (it may leave and
        # come back around the recomputations: that is what its level counts)
        again = {t for t in held if on(w.h.get((gap, t))) and t in host and t not in inputs}
        release((there | inputs) - again)
        for i, j in enumerate(remakes):
            for t in g.needs_map[("R", j)]:
                ready(t, gap)
            made = g.allocs_map[("R", j)]
            if any(u in held for u in made):
                raise Unusable(j)
            out.append(Compute("R", j))
            held.update(made)
            # what no later recomputation of the gap reads and step gap does not
            # keep goes at once
            release(there | {t for k in remakes[i + 1:] for t in g.needs_map[("R", k)]})
        release(there)
        for t in sorted(there - held):
            if on(w.h.get((gap, t))) and t in host:
                out.append(Prefetch(t))
                held.add(t)
                flight.add(t)
        for t in g.needs_map[step]:
            ready(t, gap)
        out.append(Compute(step[0], step[1], algo.get(step, 0)))
        held.update(g.allocs_map[step])
    release(set())
    return out


MIN_S_PER_STEP = 0.05   # a window of n steps is tried with n x this long or more (its
                        # model: 0.1-0.2 s to build for 40 steps, ~1 s for 80, on ResNet-50)
TAILS = (40, 80)   # in turn, each from the plan the one before left (ResNet-50 b32 at
                   # 1.25x, superneurons' plan: 1.1794 -> 1.1641 in 10 s -> 1.1507 in 20 s;
                   # 20 steps less, 60 from superneurons' plan found nothing in 20 s:
                   # the longer window needs the shorter one's plan as its start)


def best_tail(g: Graph, cap: int, ops: list[Op], ms: float, seconds: float,
              tails: tuple[int, ...] = TAILS) -> tuple[float, list[Op], int] | None:
    """:func:`splice` over ``tails`` in turn, each from the best plan so far,
    within about ``seconds`` (the first a third of them, the last what is
    left): (ms, ops, the longest tail that improved it), or None."""
    t0 = time.perf_counter()
    best = None
    for i, n in enumerate(tails):
        left = seconds - (time.perf_counter() - t0)
        share = left / 3 if i < len(tails) - 1 else left
        if share < n * MIN_S_PER_STEP:
            continue   # not time enough to build this window's model and search it
        got = splice(g, cap, ops, ms, n, share)
        if got is not None:
            ms, ops = got
            best = (ms, ops, n)
    return best
