"""The class's bounds from its stage windows: the MILP's rows of its last
stages alone (the suffix; issue 15, seventh pass), and those of every
window of stages, their least times added up (:func:`split_bound`, eighth
pass).  Each is a relaxation of the class, so a bound on it.

Any subset of a MILP's rows, over the columns they use with the same
bounds, is a relaxation: every plan of the class satisfies it, so the
subset's least makespan (its solver's dual bound) is at most the class
optimum.  The subset taken is every row none of whose columns belongs to a
stage before ``K - N`` (the keep, recompute, prefetch, workspace and start
time columns of a stage; the offload, makespan and engine columns belong
to none): the route's last ``N`` stages with every row that ties them
together, the rest of the plan free but for the start times' bounds.  In
the capped model (:func:`snsim.policies.optimal.capped`) those bounds are
the cutoff's windows (stage k starts after the fastest steps before it and
early enough for the fastest steps after it to end by the cutoff), so the
subset bounds every plan of the class that is no slower than the cutoff,
and the subset infeasible proves that no plan of the class reaches it.

Why it helps: on the ResNets and Inception-v4 HiGHS does not solve the
full model's root LP within the limit (ResNet-50 b32 at 1.5x: 217k rows
after presolve, its interior point method 240 s and not done), so the
class gave no bound there.  The last 80 stages of ResNet-50 b32's capped
model (55k rows) are a MILP whose LP is solved in 5 s: at 1.5x and 2x it
was infeasible (no plan of the class is faster than superneurons' polished
plan; since the class swaps gradients the LP is not, the MILP is, in 10
s), at 1.25x its dual bound reaches 1.116 x compute in 30 s (the LP of
the last 120 stages 1.085, the moment and window bounds 1.038).  It is a
bound on the class only, like every bound of the solver: the class leaves
out swaps inside a stage, a gradient swapped where no stage separates its
birth from its next read, and more (DESIGN 6a), which
``schedule_bound_ms`` (moment, window) does not.

The windows before the last add what the suffix leaves free: with the
time, ResNet-50 b32 at 1.25x 1.1315 x compute in 120 s (the last 80
stages 46.3 ms above their fastest steps, the 80 before them 2.1 ms; the
suffix alone 1.131 in 300 s), ResNet-101 b32 at 1.25x 1.0548 (34.4 and
2.8 ms; the LPs of the 160 stages before them 2.9 and 2.6 ms more).  On
ResNet-152 and Inception-v4 the LPs of the windows before the last say
nothing above their fastest steps.
"""

from __future__ import annotations

import math
import time

from snsim.policies.optimal import child
from snsim.policies.optimal.formulation import Formulation
from snsim.policies.optimal.milp import Milp
from snsim.policies.optimal.solve import Solution, solve

TRIES = ((80, True), (80, False))   # (stages, LP relaxation?) tried, in this order
SHARE = 0.8   # each try gets at most this share of the time left, the last all of it
ISOLATE_NONZEROS = 20_000   # a suffix this large is solved in a killable child (as window.py)


def stages(f: Formulation) -> dict[int, int]:
    """Column -> the stage it belongs to (those of no stage absent)."""
    of: dict[int, int] = {}
    for d in (f.S, f.R, f.P):
        for (k, _), v in d.items():
            of[v] = k
    for k, cols in f.A.items():
        for v, _ in cols:
            of[v] = k
    for k, v in enumerate(f.T):
        of[v] = k
    return of


def suffix_milp(f: Formulation, first: int, of: dict[int, int] | None = None) -> Milp:
    """The rows of ``f``'s model none of whose columns belongs to a stage before
    ``first``, over the columns they use (bounds, costs and integrality kept;
    the makespan always among them)."""
    m = f.milp
    of = stages(f) if of is None else of
    rows = [r for r in m.rows if all(of.get(c, first) >= first for c in r[0])]
    return restricted(m, rows, {f.Z})[0]


def restricted(m: Milp, rows: list, keep: set) -> tuple[Milp, dict[int, int]]:
    """``m``'s ``rows`` over the columns they use and those in ``keep``
    (bounds, costs and integrality kept), and each column's index there."""
    cols = sorted({c for r in rows for c in r[0]} | keep)
    new = {c: i for i, c in enumerate(cols)}
    sub = Milp()
    for c in cols:
        sub.var(m.lb[c], m.ub[c], m.cost[c], m.integer[c])
    sub.rows = [([new[c] for c in idx], list(val), lo, hi) for idx, val, lo, hi in rows]
    return sub, new


def suffix_bound(f: Formulation, seconds: float, stats: dict | None = None,
                 tries: tuple[tuple[int, bool], ...] = TRIES) -> tuple[float, bool]:
    """(bound, infeasible): the largest dual bound of the suffix models of
    ``f`` in ``tries`` ((its last n stages, as an LP relaxation?), in turn,
    within about ``seconds``: each at most ``SHARE`` of the time left, the
    last all of it), and whether one was infeasible (then no plan of
    ``f``'s class exists, or, ``f`` capped, none reaches its cutoff; the
    bound is then ``inf``).  The LP relaxation first: an infeasible one is
    found in seconds where the MILP's presolve alone may take longer
    (ResNet-50 b32 at 2x, the last 80 stages: 4 s against over 20); the
    MILP's dual bound then says more (at 1.25x 1.103 against the LP's
    1.076 x compute, in 20 s).  ``stats`` gets ``suffix_steps`` (the
    suffix that gave the bound) and ``suffix_s``."""
    t0 = time.perf_counter()
    K = len(f.T) - 1
    of = stages(f)
    best, steps = 0.0, 0
    made: dict[int, Milp] = {}
    for i, (n, relax) in enumerate(tries):
        if seconds - (time.perf_counter() - t0) <= 0.1:
            break
        n = min(n, K)
        if n not in made:   # 1.1 s for ResNet-152 b32's 1.8M rows
            made[n] = suffix_milp(f, K - n, of)
        sub = made[n].relaxed() if relax else made[n]
        left = seconds - (time.perf_counter() - t0)
        share = 1.0 if i == len(tries) - 1 else SHARE
        # in a child killed at the limit: HiGHS's presolve of a suffix's MILP
        # does not read its own (overruns of 1-3 s on ResNet-101 and -152)
        sol: Solution = solve(sub, max(0.1, share * left),
                              isolate=child.available() and sub.nonzeros >= ISOLATE_NONZEROS)
        if sol.status == "infeasible":
            best, steps = math.inf, n
            break
        if relax and sol.status != "optimal":
            continue   # an LP stopped short bounds nothing
        # an LP's optimum is its bound (HiGHS reports no MIP dual bound for it)
        got = sol.objective if relax else sol.bound
        if got > best:
            best, steps = got, n
    if stats is not None:
        stats["suffix_steps"] = steps
        stats["suffix_s"] = round(time.perf_counter() - t0, 3)
    return best, math.isinf(best)


SPAN = 80        # stages a window (the last one: the suffix above)
LP_SHARE = 0.4   # of the time, at most, on the windows' LP relaxations
LP_NONZEROS_PER_S = 60_000   # a window's LP is tried only with its nonzeros / this left
EXCESS_MS = 1e-6   # a window's bound this far above its fastest steps says something


def spans(f: Formulation, of: dict[int, int]) -> list[tuple[int, int]]:
    """Per row of ``f``'s model, (first, last) stage of its columns that
    belong to one ((K + 1, -1) where none does: such a row is in every
    window)."""
    K = len(f.T) - 1
    out = []
    for idx, _, _, _ in f.milp.rows:
        ks = [of[c] for c in idx if c in of]
        out.append((min(ks), max(ks)) if ks else (K + 1, -1))
    return out


def window_rows(span_of: list[tuple[int, int]], a: int, b: int) -> list[int]:
    """The rows whose staged columns all lie in stages ``a`` ... ``b`` (and
    those with none)."""
    return [i for i, (lo, hi) in enumerate(span_of) if lo >= a and hi <= b]


def window_milp(f: Formulation, a: int, b: int, rows: list[int]) -> Milp:
    """``f``'s model's ``rows`` (:func:`window_rows` of stages ``a`` ...
    ``b``) over the columns they use (bounds and integrality kept),
    minimising ``T_b - T_a`` (``Z - T_a`` where ``b`` is the route's end)."""
    K = len(f.T) - 1
    top = f.Z if b == K else f.T[b]
    sub, new = restricted(f.milp, [f.milp.rows[i] for i in rows], {f.T[a], top})
    sub.cost = [0.0] * len(sub.lb)
    sub.cost[new[top]] = 1.0
    sub.cost[new[f.T[a]]] = -1.0   # T_0 is fixed at 0
    return sub


def split_bound(f: Formulation, seconds: float, stats: dict | None = None,
                span: int = SPAN, progress=None, limit=None) -> tuple[float, bool]:
    """(bound, infeasible): a lower bound on the makespan of every plan of
    ``f``'s class, from its stages split into windows of ``span`` stages.
    Each window's rows (:func:`window_milp`) are a relaxation, so the
    least ``T_b - T_a`` of a window bounds that part of every plan, and
    the windows' least times add up: ``Z >= T_K = sum over the windows of
    T_b - T_a``; a window not solved counts its fastest steps (every plan
    takes that long).  The windows' LP relaxations first, from the end
    (where the copies bind), within ``LP_SHARE`` of the time, each only
    where the time left allows its size (``LP_NONZEROS_PER_S``); then the
    MILPs of those whose LP said more than their fastest steps, largest
    first (then those whose LP the time cut short), each given an equal
    part of the time left (a MILP's bound grows fast at first, then slowly:
    ResNet-50 b32 at 1.25x, the last 80 stages 45.1 ms above their fastest
    steps in 22 s, 46.3 in 113 s; the 80 before them 2.1 from the LP, 4.2
    in 25 s).  ``infeasible``: a window without a solution, or the sum
    above the model's makespan bound (the capped model's cutoff) or
    ``limit()``: no plan of the class reaches it (bound ``inf``).
    ``stats`` gets ``suffix_steps`` (the stages of the windows whose LP
    was solved), ``suffix_windows`` ([first stage, last stage, ms above
    their fastest steps] of each window that says more than that) and
    ``suffix_s``; ``progress(bound)`` is called with the sum
    each time it grows and stays within the cap (a parent that kills the
    work keeps the last); ``limit()``, where given, a cap (ms) no looser
    than the model's that may tighten meanwhile (a faster plan found)."""
    t0 = time.perf_counter()
    left = lambda: seconds - (time.perf_counter() - t0)  # noqa: E731
    K = len(f.T) - 1
    of = stages(f)
    span_of = spans(f, of)
    length = [len(r[0]) for r in f.milp.rows]
    windows = [(max(0, b - span), b) for b in range(K, 0, -span)]
    fast = {w: f.early[w[1]] - f.early[w[0]] for w in windows}
    best = dict(fast)
    made: dict = {}
    solved = 0
    cap = f.milp.ub[f.Z]

    def take(w, sol: Solution, relax: bool) -> bool:
        """Record ``sol``; True when it proves the class has no plan."""
        if sol.status == "infeasible":
            return True
        if relax and sol.status != "optimal":
            return False   # an LP stopped short bounds nothing
        got = sol.objective if relax else sol.bound
        if got <= best[w]:
            return False
        best[w] = got
        now = cap if limit is None else min(cap, limit())
        if sum(best.values()) > now * (1 + 1e-9) + 1e-6:
            return True
        if progress is not None:
            progress(sum(best.values()))
        return False

    def run(sub: Milp, limit_s: float) -> Solution:
        # in a child killed at the limit: HiGHS's presolve does not read its own
        return solve(sub, max(0.1, limit_s),
                     isolate=child.available() and sub.nonzeros >= ISOLATE_NONZEROS)

    none = False
    short = []   # windows whose LP the time cut short
    lp_ends = t0 + LP_SHARE * seconds
    for w in windows:
        lp_left = lp_ends - time.perf_counter()
        if lp_left <= 0.1:
            break
        rows = window_rows(span_of, *w)
        if w != windows[0] and sum(length[i] for i in rows) > LP_NONZEROS_PER_S * lp_left:
            continue   # too large for the time left: an earlier (smaller) one may fit
        made[w] = sub = window_milp(f, *w, rows)
        sol = run(sub.relaxed(), min(SHARE * left(), lp_ends - time.perf_counter()))
        if sol.status in ("optimal", "infeasible"):
            solved += w[1] - w[0]
        else:
            short.append(w)
        if take(w, sol, True):
            none = True
            break
    # the MILPs: those whose LP said something, largest first; then those
    # whose LP was cut short (the MILP's root may yet be solved in its time)
    order = sorted((w for w in made if best[w] > fast[w] + EXCESS_MS),
                   key=lambda w: fast[w] - best[w]) + short
    for i, w in enumerate(order):
        if none or left() <= 0.1:
            break
        none = take(w, run(made[w], left() / (len(order) - i)), False)
    if stats is not None:
        stats["suffix_steps"] = solved
        stats["suffix_windows"] = [[a, b, round(best[a, b] - fast[a, b], 6)]
                                   for a, b in windows if best[a, b] > fast[a, b] + EXCESS_MS]
        stats["suffix_s"] = round(time.perf_counter() - t0, 3)
    return (math.inf, True) if none else (sum(best.values()), False)
