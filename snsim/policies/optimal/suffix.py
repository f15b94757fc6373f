"""The class's suffix bound: the MILP's rows of its last stages alone (a
relaxation of the class, so a bound on it; issue 15, seventh pass).

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
is infeasible (no plan of the class is faster than superneurons' polished
plan), at 1.25x its dual bound reaches 1.116 x compute in 30 s (the LP of
the last 120 stages 1.085, the moment and window bounds 1.038).  It is a
bound on the class only, like every bound of the solver: the class leaves
out gradient swaps, swaps inside a stage and more (DESIGN 6a), which
``schedule_bound_ms`` (moment, window) does not.
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
    cols = sorted({c for r in rows for c in r[0]} | {f.Z})
    new = {c: i for i, c in enumerate(cols)}
    sub = Milp()
    for c in cols:
        sub.var(m.lb[c], m.ub[c], m.cost[c], m.integer[c])
    sub.rows = [([new[c] for c in idx], list(val), lo, hi) for idx, val, lo, hi in rows]
    return sub


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
